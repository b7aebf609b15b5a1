"""The trainer's door and a reward past float32's range (what a hostile or broken reward worker
could send; agents, environments and reward functions are refused before it): the group is set
aside and its ticket ended `skipped`, not left open to be redone and refused forever; a late copy
of it ends nothing more; a reward that is out of range group after group ends the run naming
it. A real Trainer on an in-process store and bus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamarl.bus import MemoryHub
from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.sync_run import lock_step_config
from llamarl.protocol import ScoredGroup, TypedArray
from llamarl.roles import build
from llamarl.roles import trainer as trainer_module
from llamarl.roles.trainer import Trainer
from llamarl.store import MemoryStore
from llamarl.weightsync import make_publisher
from tests.factories import rollout_group
from tests.memory_runtime import memory_runtime

MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def _trainer(tmp_path: Path) -> tuple[Trainer, MemoryStore]:
    """A trainer whose store has issued tickets 0..7."""
    tree = {
        "run_id": "aside",
        "run_dir": str(tmp_path),
        "model": MODEL,
        "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 4},
        "trainer": {"prompts_per_step": 4, "num_steps": 2, "sft_steps": 0},
    }
    config = lock_step_config(parse_config(tree))
    store = MemoryStore()
    store.publish_version(0, {})
    store.claim_tickets("g0", 8, lease_s=60, max_staleness=1, prompts_per_step=4)
    hub = MemoryHub("aside")
    runtime = memory_runtime("trainer", config, "trainer", store, hub)
    return build.trainer(runtime, make_publisher(config.sync, config.run_id), evaluates_all=True), store


def _scored(ticket_id: int, rewards: list[float]) -> ScoredGroup:
    values = TypedArray.from_numpy(np.array(rewards, dtype=np.float32))
    return ScoredGroup(group=rollout_group(ticket_id), rewards=values, scorer="hostile")


def test_a_group_refused_for_its_reward_is_set_aside_and_its_ticket_ended(tmp_path: Path) -> None:
    trainer, store = _trainer(tmp_path)
    with np.errstate(over="ignore"):  # what a careless sender's float32 cast makes of 1e300
        trainer.admit(_scored(0, [1e300, 0.0]))
    trainer.admit(_scored(1, [1.0, 0.0]))
    trainer.admit(_scored(2, [float("nan"), 1.0]))
    trainer.aside.end()
    assert [store.ticket_state(i) for i in range(3)] == ["skipped", "open", "skipped"]
    assert [g.group.ticket_id for g in trainer.buffer] == [1]
    trainer.admit(_scored(0, [float("inf"), 0.0]))  # a late copy of the ticket set aside
    trainer.aside.end()
    ledger = store.ledger()
    assert ledger["skipped"] == 2 and ledger["duplicate"] == 0, "the late copy ends nothing"
    assert trainer.runtime.counters["groups_bad_reward"] == 2
    trainer.runtime.rejections.flush(force=True)
    assert store.rejected()["trainer.bad_reward"] == 3, "every refusal counted, the late copy's too"
    trainer.close()


def test_rewards_out_of_range_group_after_group_end_the_run_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainer_module, "ENV_FAILURES_IN_A_ROW", 3)
    trainer, _ = _trainer(tmp_path)
    trainer.admit(_scored(0, [float("inf"), 0.0]))
    trainer.admit(_scored(1, [1.0, 0.0]))  # one that passes starts the count again
    trainer.admit(_scored(2, [float("inf"), 0.0]))
    trainer.admit(_scored(3, [float("inf"), 0.0]))
    with pytest.raises(ConfigError, match="rewards of 3 groups in a row were past float32's range .*task.reward"):
        trainer.admit(_scored(4, [float("inf"), 0.0]))
    trainer.close()
