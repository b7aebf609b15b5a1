"""Dynamic sampling end to end on in-process parts: the trainer skips groups whose rewards are all
equal, the gate hands out new prompts in their place, the step fills with groups that carry
signal, and the ledger balances (issued = trained + skipped + dropped_stale + open); in a sync
run the cap on draws lets every step finish even when no group carries signal."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamarl.bus import MemoryHub
from llamarl.config import RunConfig, parse_config
from llamarl.launch.sync_run import run_sync
from llamarl.protocol import ScoredGroup, TypedArray
from llamarl.roles import build
from llamarl.roles.trainer import Trainer
from llamarl.store import MemoryStore
from llamarl.topics import SCORED
from llamarl.weightsync import make_publisher
from tests.factories import rollout_group
from tests.memory_runtime import memory_runtime

MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}
PPS = 4
GATE = {"lease_s": 60.0, "max_staleness": 1, "prompts_per_step": PPS}


def _config(tmp_path: Path, **sections: Any) -> RunConfig:
    tree = {
        "run_id": "dapo",
        "run_dir": str(tmp_path),
        "model": MODEL,
        "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 4},
        "generation": {"num_samples": 2, "max_new_tokens": 3, "min_new_tokens": 2},
        "trainer": {"prompts_per_step": PPS, "num_steps": 2, "eval_every": 2, "sft_steps": 0, "checkpoint_every": 0},
        "sampling": {"dynamic_sampling": True, "max_draws_factor": 2},
    }
    return parse_config(tree | sections, environ={})


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[Trainer, MemoryStore, MemoryHub]]:
    """A started trainer on a MemoryStore and MemoryHub, as a sync run builds it."""
    config = _config(tmp_path, sync={"transport": "local"})
    store, hub = MemoryStore(), MemoryHub("dapo")
    runtime = memory_runtime("trainer", config, "trainer", store, hub)
    trainer = build.trainer(runtime, make_publisher(config.sync, "dapo"))
    trainer.start()
    yield trainer, store, hub
    trainer.close()
    runtime.close()


def _push(hub: MemoryHub, ticket_ids: list[int], attempt: int = 0) -> None:
    """Scored groups for these tickets: even ids all rewards equal, odd ids one right, one
    wrong."""
    generator = hub.client("reward-0")
    for ticket_id in ticket_ids:
        rewards = [1.0, 1.0] if ticket_id % 2 == 0 else [1.0, 0.0]
        group = dataclasses.replace(rollout_group(ticket_id), attempt=attempt)
        scored = ScoredGroup(group, TypedArray.from_numpy(np.array(rewards, np.float32)), "test")
        generator.push(SCORED, scored, policy_version=0)


def _balanced(ledger: dict[str, int]) -> bool:
    ended = ledger["trained"] + ledger["skipped"] + ledger["dropped_stale"]
    return ledger["issued"] == ended + ledger["open"]


def test_half_the_groups_without_signal_are_skipped_and_replaced(
    started: tuple[Trainer, MemoryStore, MemoryHub],
) -> None:
    trainer, store, hub = started
    claimed = store.claim_tickets("generator-0", 100, **GATE)
    assert [t.ticket_id for t in claimed] == list(range(8)), "the gate: 2 steps' worth at v0"
    _push(hub, [0, 1, 2, 3])
    assert not trainer.gather(0), "two groups with signal of the four needed"
    assert [g.group.ticket_id for g in trainer.buffer] == [1, 3]
    assert [store.ticket_state(i) for i in range(4)] == ["skipped", "open", "skipped", "open"]
    ledger = store.ledger()
    assert (ledger["skipped"], ledger["open"]) == (2, 6) and _balanced(ledger)
    replacements = store.claim_tickets("generator-0", 100, **GATE)
    assert [t.ticket_id for t in replacements] == [8, 9], "a skipped ticket frees its slot"
    _push(hub, [4, 5, 6, 7])
    _push(hub, [0], attempt=1)  # a late copy of a skipped ticket is a duplicate, not trained
    assert trainer.gather(0)
    assert [g.group.ticket_id for g in trainer.buffer] == [1, 3, 5, 7]
    assert trainer.runtime.counters["duplicate_groups"] == 1
    record = trainer.train_step()
    assert record["groups_skipped"] == 4
    journal = Path(trainer.runtime.config.run_dir) / "trained.jsonl"
    trained = [json.loads(line)["ticket_id"] for line in journal.open()]
    assert trained == [1, 3, 5, 7], "the step holds only groups that carry signal"
    ledger = store.ledger()
    assert (ledger["issued"], ledger["trained"], ledger["skipped"], ledger["open"]) == (10, 4, 4, 2)
    assert ledger["dropped_stale"] == 0 and _balanced(ledger)
    assert trainer.runtime.counters["groups_skipped"] == 4


def test_past_the_cap_a_step_takes_groups_without_signal(
    started: tuple[Trainer, MemoryStore, MemoryHub],
) -> None:
    trainer, store, hub = started
    store.claim_tickets("generator-0", 100, **GATE)
    _push(hub, [0, 2, 4, 6, 1])  # max_draws_factor 2: four skips a step
    assert not trainer.gather(0)
    assert [t.ticket_id for t in store.claim_tickets("generator-0", 100, **GATE)] == [8, 9, 10, 11]
    _push(hub, [8, 10, 3, 9])
    assert trainer.gather(0), "past the cap, groups without signal fill the step"
    assert [g.group.ticket_id for g in trainer.buffer] == [1, 8, 10, 3, 9]
    record = trainer.train_step()
    assert record["groups_skipped"] == 4
    assert [g.group.ticket_id for g in trainer.buffer] == [9], "kept for the next step"
    ledger = store.ledger()
    assert (ledger["issued"], ledger["trained"], ledger["skipped"], ledger["open"]) == (12, 4, 4, 4)
    assert _balanced(ledger)


def test_a_sync_run_draws_again_for_skipped_groups_and_stops_at_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reward that never tells completions apart: every step skips its four, draws four more
    in their place, and trains on those (the cap reached)."""
    (tmp_path / "flat_reward.py").write_text("def score(completion, answer):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = {"kind": "arithmetic", "num_digits": 1, "num_eval": 4, "reward": "flat_reward:score"}
    summary = run_sync(_config(tmp_path / "run", task=task))
    assert summary["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["groups_skipped"] for r in records] == [PPS, PPS]
    trained = [json.loads(line)["ticket_id"] for line in (tmp_path / "run" / "trained.jsonl").open()]
    assert trained == [4, 5, 6, 7, 12, 13, 14, 15], "each step's first draw skipped"
