"""The role components on in-process parts: the synchronous baseline composed of them, and the
checks `build` makes before a role connects anywhere."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llamarl.bus import MemoryHub
from llamarl.config import RunConfig, parse_config
from llamarl.errors import ConfigError
from llamarl.launch import sync_run
from llamarl.launch.sync_run import run_sync
from llamarl.protocol import Control, ScoredGroup, TypedArray
from llamarl.rewards.custom import UserReward
from llamarl.roles import build
from llamarl.roles.base import RoleResult, run_role
from llamarl.roles.runtime import BusyTimer, RoleRuntime
from llamarl.roles.trainer import Trainer
from llamarl.roles.trainer_durability import resume, rewind_logs
from llamarl.store import MemoryStore, WorkerInfo
from llamarl.topics import CONTROL, ROLLOUTS, SCORED
from llamarl.training.checkpoint import TrainerState
from llamarl.training.evaluate import Evaluation
from llamarl.training.export import export
from tests.factories import FakeClock, rollout_group
from tests.memory_runtime import memory_runtime

MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def _config(tmp_path: Path, **sections: Any) -> RunConfig:
    tree = {
        "run_id": "roles",
        "run_dir": str(tmp_path),
        "model": MODEL,
        "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 4},
        "generation": {"num_samples": 2, "max_new_tokens": 3, "min_new_tokens": 3},
        "trainer": {"prompts_per_step": 2, "num_steps": 2, "eval_every": 2, "sft_steps": 0},
    }
    return parse_config(tree | sections)


def test_sync_run_trains_every_step_on_a_full_step_of_work(tmp_path: Path) -> None:
    """More prompts a step than the scorer takes in one batch, so the lock step must drain it."""
    trainer = {
        "prompts_per_step": 70,
        "num_steps": 2,
        "eval_every": 2,
        "checkpoint_every": 1,
        "sft_steps": 0,
    }
    summary = run_sync(_config(tmp_path, trainer=trainer))
    assert summary["mode"] == "sync" and summary["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["num_tokens"] == 70 * 2 * 3 for r in records), "equal work every step"
    assert all({"generate_s", "score_s", "train_s", "step_s"} <= r.keys() for r in records)
    trained = (tmp_path / "trained.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["ticket_id"] for line in trained) == list(range(140))
    assert max(json.loads(line)["staleness"] for line in trained) == 0
    assert not (tmp_path / "checkpoints").exists(), "a sync run cannot resume: no checkpoints"
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written == {k: v for k, v in summary.items() if k not in ("ledger", "rejected")}
    assert summary["ledger"]["trained"] == summary["ledger"]["issued"] == 140, "the ledger balances"
    evaluations = [json.loads(line) for line in (tmp_path / "samples.jsonl").open()]
    assert [e["step"] for e in evaluations] == [0, 2], "the starting policy and step 2"
    assert evaluations[-1]["accuracy"] == summary["final_accuracy"]
    for shown in evaluations[-1]["samples"]:
        assert shown.keys() == {"prompt", "completion", "answer", "reward"}
        assert shown["reward"] in (0.0, 1.0)
    assert len(evaluations[-1]["samples"]) == 3
    assert summary["model"] == str(tmp_path / "model")


def test_a_finished_run_exports_its_final_model_else_its_newest_checkpoint(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    summary = run_sync(_config(run_dir))
    exported = export(run_dir, tmp_path / "out")
    assert exported == run_dir / "model"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    AutoTokenizer.from_pretrained(tmp_path / "out")
    trained = AutoModelForCausalLM.from_pretrained(summary["model"])
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values(), strict=True)
    )
    with pytest.raises(ConfigError, match="exists and is not empty"):
        export(run_dir, tmp_path / "out")
    # A run stopped before the end has no final model: its newest complete checkpoint is taken.
    for step in ("step-00000001", "step-00000002", "step-00000003.tmp"):
        shutil.copytree(run_dir / "model", run_dir / "checkpoints" / step / "model")
    shutil.rmtree(run_dir / "model")
    assert export(run_dir, tmp_path / "out2") == run_dir / "checkpoints" / "step-00000002"
    with pytest.raises(ConfigError, match="no final model"):
        export(tmp_path / "out", tmp_path / "out3")


def test_an_async_role_refuses_the_in_process_transport_before_connecting(tmp_path: Path) -> None:
    config = _config(
        tmp_path, sync={"transport": "local"}, redis={"url": "redis://127.0.0.1:1/0"}, broker={"port": 5555}
    )
    with pytest.raises(ConfigError, match="sync.transport: local .* --mode sync"):
        build.connect("generator", config, "generator-0")


def test_a_worker_id_too_long_for_the_wire_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, redis={"url": "redis://127.0.0.1:1/0"}, broker={"port": 5555})
    with pytest.raises(ConfigError, match="worker id .* 65 characters; at most 64"):
        build.connect("generator", config, "g" * 65)


def test_repeated_resumes_from_one_checkpoint_keep_the_gate_at_the_trained_version() -> None:
    """A trainer that crashes again and again before its next checkpoint: every resume publishes
    a fresh version number, but the gate must keep counting the versions actually trained."""
    store = MemoryStore()
    pps, k = 4, 1
    for version in range(11):  # ten steps trained and published, the checkpoint at step 4
        store.publish_version(version, {})
    checkpoint = TrainerState(step=4, policy_version=4)
    for _ in range(3):
        resumed = resume(store, checkpoint, every_steps=1, lost=[])
        assert resumed is not None
        store.publish_version(resumed[0], {})
        claimable = store.claim_tickets("g0", 1000, lease_s=60, max_staleness=k, prompts_per_step=pps)
        # Tickets of trained version 4 plus k ahead, issued in the first round, none after.
        assert store.ledger()["issued"] == (4 + k + 1) * pps, claimable
    newest = resumed[0]
    for version in (newest + 1, newest + 2):  # the resumed trainer trains steps 5 and 6
        store.publish_version(version, {})
    store.claim_tickets("g0", 1000, lease_s=60, max_staleness=k, prompts_per_step=pps)
    assert store.ledger()["issued"] == (6 + k + 1) * pps, "the gate must open with training"


def test_a_resume_reissues_at_once_what_was_issued_to_the_trainer_before_it() -> None:
    """The rollouts the last trainer held, or that were on their way to it, died with it: a
    resume reissues their tickets at once, not when their leases (a minute) run out. The group
    its checkpoint holds stays with it; a lost step's tickets are reissued too."""
    store = MemoryStore()
    store.publish_version(0, {})
    claimed = store.claim_tickets("g0", 6, lease_s=60, max_staleness=1, prompts_per_step=4)
    assert [t.ticket_id for t in claimed] == [0, 1, 2, 3, 4, 5]
    store.end_tickets([(0, "trained"), (1, "trained")])  # a step past the checkpoint, lost
    rewards = TypedArray.from_numpy(np.array([1.0, 0.0], dtype=np.float32))
    held = ScoredGroup(group=rollout_group(2), rewards=rewards, scorer="exact_int")
    checkpoint = TrainerState(step=0, policy_version=0, buffer=[held])
    resumed = resume(store, checkpoint, every_steps=1, lost=[{"ticket_id": 0}, {"ticket_id": 1}])
    assert resumed is not None and [g.group.ticket_id for g in resumed[1]] == [2]
    again = store.claim_tickets("g1", 10, lease_s=60, max_staleness=1, prompts_per_step=4)
    reissued = sorted(t.ticket_id for t in again if t.reissued)
    assert reissued == [0, 1, 3, 4, 5], "every ticket issued and not held, none after its lease"


def _fast_beating_trainer(tmp_path: Path, worker_id: str) -> tuple[RoleRuntime, MemoryStore, FakeClock]:
    """A registered trainer runtime whose heartbeat TTL is 0.1 s (beats every 0.02 s), on a store
    whose clock (which expires registrations) moves only when the test moves it: how soon a
    thread gets the CPU cannot expire anything."""
    config = _config(tmp_path, workers={"heartbeat_s": 0.02, "heartbeat_ttl_s": 0.1})
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    hub = MemoryHub("roles")
    runtime = memory_runtime("trainer", config, worker_id, store, hub)
    runtime.register()
    return runtime, store, clock


def _wait_for_worker(store: MemoryStore, condition: Callable[[WorkerInfo], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a hang guard: the thread beats every 0.02 s
    while not condition(store.workers()[0]):
        assert time.monotonic() < deadline, what


def test_keep_alive_beats_through_a_phase_longer_than_the_heartbeat_ttl(tmp_path: Path) -> None:
    runtime, store, clock = _fast_beating_trainer(tmp_path, "trainer")
    ttl_s = runtime.config.workers.heartbeat_ttl_s
    with runtime.keep_alive("warm-start") as phase:
        for _ in range(6):  # the long phase: 3 TTLs of store time, in steps under one TTL
            seen = store.workers()[0].fields["last_seen"]
            clock.advance(ttl_s / 2)
            _wait_for_worker(
                store,
                lambda w, seen=seen: w.fields["last_seen"] != seen,
                "no heartbeat came from the keep-alive thread",
            )
            (worker,) = store.workers()
            assert worker.alive and worker.fields["status"] == "warm-start"
        phase.report("warm start", 3, 10)  # what a Progress listener does
        _wait_for_worker(
            store, lambda w: w.fields["status"] == "warm start 3/10", "the status never showed the progress"
        )
    assert not [t for t in threading.enumerate() if t.name.startswith("keep-alive")]
    runtime.close()


def test_a_training_step_longer_than_the_ttl_brings_back_the_whole_registration(
    tmp_path: Path,
) -> None:
    """A worker whose key expired between two beats (a step longer than the TTL) is re-created
    with its role and pid by the keep-alive thread, so the monitor finds the trainer again."""
    runtime, store, clock = _fast_beating_trainer(tmp_path, "trainer-7")
    clock.advance(2 * runtime.config.workers.heartbeat_ttl_s)  # no beat: the registration expires
    assert not store.workers()[0].alive
    with runtime.keep_alive("running", beat_now=False):
        _wait_for_worker(store, lambda w: w.alive, "the keep-alive thread never beat")
        fields = store.workers()[0].fields
    assert fields["role"] == "trainer" and int(fields["pid"]) > 0, fields
    runtime.close()


def test_a_custom_reward_function_scores_training_and_bad_ones_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "quarter_reward.py").write_text(
        "def score(completion, answer):\n    return 0.25\n\nNOT_A_FUNCTION = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run_sync(
        _config(
            tmp_path / "run",
            task={"kind": "arithmetic", "num_digits": 1, "num_eval": 4, "reward": "quarter_reward:score"},
        )
    )
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["reward_mean"] for r in records] == [0.25, 0.25]
    with pytest.raises(ConfigError, match="task.reward no_such_module:f: cannot import"):
        UserReward(_config(tmp_path, task={"reward": "no_such_module:f"}).task)
    with pytest.raises(ConfigError, match="has no function NOT_A_FUNCTION"):
        UserReward(_config(tmp_path, task={"reward": "quarter_reward:NOT_A_FUNCTION"}).task)
    with pytest.raises(ConfigError, match="task.reward"):
        _config(tmp_path, task={"reward": "not a spec"})


def test_busy_timer_records_busy_spans_and_merges_ones_that_touch() -> None:
    clock = FakeClock()
    timer = BusyTimer(clock=clock, wall=clock)
    for busy_s, idle_s in ((1.0, 0.001), (2.0, 5.0), (0.5, 0.0)):
        timer.busy()
        clock.advance(busy_s)
        timer.idle()
        clock.advance(idle_s)
    assert timer.spans == [[1000.0, 1003.001], [1008.001, 1008.501]]
    assert timer.busy_s == pytest.approx(3.5) and timer.idle_s == pytest.approx(5.001)


def test_the_trainers_heartbeat_shows_its_latest_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    beats: list[dict[str, Any]] = []

    class RecordingStore(MemoryStore):
        def end_tickets(self, outcomes, heartbeat=None):  # type: ignore[no-untyped-def]
            if heartbeat is not None:
                beats.append(dict(heartbeat.fields))
            return super().end_tickets(outcomes, heartbeat)

    monkeypatch.setattr(sync_run, "MemoryStore", RecordingStore)
    evaluations = iter([0.1, 0.2, 0.3, 0.4])  # a different accuracy at each evaluation
    monkeypatch.setattr(Trainer, "_evaluate", lambda self: Evaluation(next(evaluations), [], None, 4))
    trainer = {"prompts_per_step": 2, "num_steps": 5, "eval_every": 2, "sft_steps": 0}
    summary = sync_run.run_sync(_config(tmp_path, trainer=trainer))
    evaluated = {0: summary["initial_accuracy"]} | {
        r["step"]: r["held_out_accuracy"]
        for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
        if "held_out_accuracy" in r
    }
    assert [b["step"] for b in beats] == [1, 2, 3, 4, 5]
    for beat in beats:  # a step beats before it evaluates
        latest = max(step for step in evaluated if step < beat["step"])
        assert beat["held_out_accuracy"] == evaluated[latest], (beat, evaluated)


def test_a_resume_rewinds_every_step_log_to_the_checkpoint(tmp_path: Path) -> None:
    for name in ("metrics.jsonl", "trained.jsonl", "samples.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    lost = rewind_logs(tmp_path, 3)
    assert [entry["step"] for entry in lost] == [4, 5]  # the journal entries past the checkpoint
    for name in ("metrics.jsonl", "trained.jsonl", "samples.jsonl"):
        steps = [json.loads(line)["step"] for line in (tmp_path / name).open()]
        assert steps == [1, 2, 3], name


def test_run_role_starts_runs_and_closes_a_role_and_returns_its_result(tmp_path: Path) -> None:
    """The reward scorer through the roles' one interface: the groups waiting when a stop comes
    are scored, and the typed result counts them."""
    config = _config(tmp_path)
    store, hub = MemoryStore(), MemoryHub("roles")
    runtime = memory_runtime("reward", config, "reward-0", store, hub)
    scored = hub.client("trainer").consume(SCORED)
    for ticket_id in (1, 2):
        hub.client("generator-0").push(ROLLOUTS, rollout_group(ticket_id), policy_version=0)
    hub.client("trainer").publish(CONTROL, Control("stop", {"reason": "test"}), 0)
    result = run_role(build.reward(runtime))
    assert result == RoleResult("reward", "reward-0", 2)
    assert {scored.recv(1000).payload.group.ticket_id for _ in range(2)} == {1, 2}  # type: ignore[union-attr]
    runtime.close()


def test_run_role_closes_a_role_whose_run_fails() -> None:
    class Failing:
        closed = False

        def start(self) -> None:
            pass

        def run(self) -> RoleResult:
            raise RuntimeError("the loop broke")

        def close(self) -> None:
            self.closed = True

    role = Failing()
    with pytest.raises(RuntimeError, match="the loop broke"):
        run_role(role)
    assert role.closed
