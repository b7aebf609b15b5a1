"""`llamarl worker trainer`: gather scored groups, enforce staleness, train, publish versions.

A group whose oldest token is more than `max_staleness` versions behind the trainer's version at
the time of use is dropped and its ticket ended as `dropped_stale`; every trained group ends its
ticket as `trained` (exactly once, by Lua compare-and-set). Each trained group is also written to
RUN_DIR/trained.jsonl (ticket, rollout id, staleness) so a run can be audited; the line is written
before the ticket is ended, so a crash never ends a ticket that the journal lacks.

Checkpoints (`llamarl.checkpoint`) are written after the warm start, every
`trainer.checkpoint_every` steps and on a requested stop. A trainer resumes from the newest one of
its run: it publishes version max(checkpoint, Redis) + 1, so no version number is reused, and
rewinds the journal to the checkpoint's step. The tickets trained after that step, whose updates
the crash lost, are reopened in Redis: those whose rollout is in the restored buffer are trained
from it, the others are reissued to generators. So every ticket's update is in the final model
exactly once (or its ticket ended `dropped_stale`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import structlog

from llamarl.checkpoint import CheckpointStore, Restored, TrainerState
from llamarl.evaluate import accuracy
from llamarl.journal import rewind
from llamarl.learner import Learner
from llamarl.metrics import MetricsWriter
from llamarl.protocol import Control, ScoredGroup, VersionAnnouncement
from llamarl.rewards import make_verifier
from llamarl.rollouts import collate, oldest_version
from llamarl.sync_run import prepare_policy
from llamarl.tasks import make_prompt_set
from llamarl.topics import CONTROL, SCORED, VERSIONS
from llamarl.weightsync.channel import WeightPublisher
from llamarl.weightsync.flat import flatten
from workers.common import WorkerContext, run_worker

log = structlog.get_logger(__name__)
POLL_MS = 20


class Trainer:
    def __init__(self, ctx: WorkerContext) -> None:
        self.started = time.monotonic()
        self.ctx = ctx
        config = ctx.config
        prompt_set = make_prompt_set(config.task, config.seed)
        self.held_out = prompt_set.eval_items()
        self.verifier = make_verifier(config.task.verifier)
        run_dir = Path(config.run_dir)
        self.checkpoints = CheckpointStore(
            run_dir / "checkpoints", config.run_id, config.trainer.keep_checkpoints
        )
        latest = self.checkpoints.latest()
        self.restored = self.checkpoints.load(latest) if latest is not None else None
        if self.restored is not None:
            self.policy = self.restored.policy
            reference = self.restored.reference
        else:
            self.policy, reference = prepare_policy(config, prompt_set), None
        self.learner = Learner(
            self.policy, config.algorithm, config.trainer, config.generation.temperature, reference
        )
        state = self.restored.state if self.restored is not None else TrainerState(0, 0)
        if self.restored is not None:
            self.learner.optimizer.load_state_dict(self.restored.optimizer_state)
        self.step = state.step
        self.policy_version = state.policy_version
        self.max_staleness_seen = int(state.counters.get("max_staleness_seen", 0))
        self.initial_accuracy: float | None = state.counters.get("initial_accuracy")
        self.lost = rewind(run_dir / "trained.jsonl", self.step)
        rewind(run_dir / "metrics.jsonl", self.step)
        self.publisher = WeightPublisher(
            config.sync, config.run_id, ctx.curve, ctx.rejections.record
        )
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self.trained_log = (run_dir / "trained.jsonl").open("a")
        self.buffer: list[ScoredGroup] = []
        self.last: dict[str, Any] = {}
        self.rl_started = time.monotonic()

    def resume(self, restored: Restored | None) -> None:
        """Take up the run where Redis and the checkpoint left it (see the module docstring)."""
        store = self.ctx.store
        current = store.policy_version()
        if restored is None and current < 0:
            return  # a fresh run
        trained_version = self.policy_version
        self.policy_version = max(self.policy_version, current) + 1
        # Before the publish, so the gate is never wider than the trained versions allow.
        store.skip_versions(self.policy_version - trained_version)
        held = restored.state.buffer if restored is not None else []
        self.buffer = [g for g in held if store.reopen_ticket(g.group.ticket_id, requeue=False)]
        held_ids = {g.group.ticket_id for g in self.buffer}
        requeued = {e["ticket_id"] for e in self.lost} - held_ids
        for ticket_id in sorted(requeued):
            store.reopen_ticket(ticket_id, requeue=True)
        log.warning(
            "resumed",
            checkpoint=str(restored.path) if restored is not None else None,
            step=self.step,
            policy_version=self.policy_version,
            buffered=len(self.buffer),
            requeued=len(requeued),
        )
        self.ctx.counters["resumes"] = 1

    def save_checkpoint(self) -> None:
        if not self.ctx.config.trainer.checkpoint_every:
            return
        counters: dict[str, float] = {"max_staleness_seen": self.max_staleness_seen}
        if self.initial_accuracy is not None:
            counters["initial_accuracy"] = self.initial_accuracy
        state = TrainerState(self.step, self.policy_version, counters, list(self.buffer))
        path = self.checkpoints.save(
            self.policy, self.learner.reference, self.learner.optimizer, state
        )
        # Every ticket ended so far is in this checkpoint, so none below the lowest open one
        # can be reopened by a later resume: their per-ticket entries can go.
        floor = self.ctx.store.compact_tickets()
        log.info("checkpoint", path=str(path), step=self.step, ticket_floor=floor)

    def evaluate(self) -> float:
        gen = self.ctx.config.generation
        return accuracy(self.policy, self.held_out, self.verifier, gen.max_new_tokens)

    def publish(self) -> None:
        weights = flatten(self.policy.model, self.policy_version)
        meta = self.publisher.publish(weights)
        self.ctx.store.publish_version(self.policy_version, meta)
        announcement = VersionAnnouncement(
            policy_version=self.policy_version,
            num_bytes=weights.num_bytes,
            checksum=weights.checksum,
            transport=str(meta["transport"]),
            endpoint=str(meta["endpoint"]),
        )
        self.ctx.bus.publish(VERSIONS, announcement, self.policy_version)
        structlog.contextvars.bind_contextvars(policy_version=self.policy_version)

    def _count(self, name: str) -> None:
        self.ctx.counters[name] = self.ctx.counters.get(name, 0) + 1

    def admit(self, scored: ScoredGroup) -> None:
        ticket_id = scored.group.ticket_id
        in_buffer = any(item.group.ticket_id == ticket_id for item in self.buffer)
        if in_buffer or self.ctx.store.ticket_state(ticket_id) != "open":
            self._count("duplicate_groups")
            return
        self.buffer.append(scored)

    def drop_stale(self) -> None:
        limit = self.ctx.config.staleness.max_staleness
        kept = []
        for item in self.buffer:
            if self.policy_version - oldest_version(item.group) > limit:
                self.ctx.store.finish_ticket(item.group.ticket_id, "dropped_stale")
                self._count("dropped_stale")
            else:
                kept.append(item)
        self.buffer = kept

    def train_step(self) -> None:
        config = self.ctx.config
        size = config.trainer.prompts_per_step
        batch, self.buffer = self.buffer[:size], self.buffer[size:]
        staleness = [self.policy_version - oldest_version(item.group) for item in batch]
        self.ctx.timer.busy()
        record: dict[str, Any] = {"step": self.step + 1, "policy_version": self.policy_version}
        started = time.monotonic()
        record |= self.learner.step(collate(batch, self.policy.pad_id))
        record["train_s"] = time.monotonic() - started
        for item, lag in zip(batch, staleness, strict=True):
            entry = {"ticket_id": item.group.ticket_id, "rollout_id": item.group.rollout_id}
            self.trained_log.write(
                json.dumps(entry | {"staleness": lag, "step": self.step + 1}) + "\n"
            )
        self.trained_log.flush()
        for item in batch:
            if not self.ctx.store.finish_ticket(item.group.ticket_id, "trained"):
                self._count("finish_conflicts")
        self.step += 1
        self.max_staleness_seen = max([self.max_staleness_seen, *staleness])
        record |= {
            "staleness_max": max(staleness),
            "staleness_mean": sum(staleness) / len(staleness),
        }
        if self.step % config.sync.every_steps == 0:
            self.policy_version += 1
            self.publish()
        if self.step % config.trainer.eval_every == 0 or self.step == config.trainer.num_steps:
            record["held_out_accuracy"] = self.evaluate()
        if self.step % max(config.trainer.checkpoint_every, 1) == 0:
            self.save_checkpoint()
        self.ctx.timer.idle()
        record["wall_s"] = time.monotonic() - self.started
        record["rl_s"] = time.monotonic() - self.rl_started
        self.metrics.write(record)
        self.last = record

    def run(self) -> dict[str, Any]:
        ctx = self.ctx
        config = ctx.config
        self.resume(self.restored)
        self.publish()
        if self.initial_accuracy is None:
            self.initial_accuracy = self.evaluate()
            self.save_checkpoint()
        initial = self.initial_accuracy
        self.rl_started = time.monotonic()
        consumer = ctx.bus.consume(SCORED, credit=config.broker.consumer_credit)
        final = initial
        while self.step < config.trainer.num_steps and not ctx.stopping:
            ctx.beat(step=self.step, policy_version=self.policy_version,
                     reward_mean=self.last.get("reward_mean", 0.0),
                     held_out_accuracy=self.last.get("held_out_accuracy", final),
                     max_staleness=self.max_staleness_seen)  # fmt: skip
            envelope = consumer.recv(POLL_MS)
            while envelope is not None:
                self.admit(envelope.payload)
                envelope = consumer.recv(0)
            self.drop_stale()
            if len(self.buffer) >= config.trainer.prompts_per_step:
                self.train_step()
                final = self.last.get("held_out_accuracy", final)
        if self.step < config.trainer.num_steps:
            self.save_checkpoint()  # asked to stop: resume later without losing a step
        else:
            ctx.store.set_run_status("finished")
            stop = Control("stop", {"reason": "trainer finished"})
            ctx.bus.publish(CONTROL, stop, self.policy_version)
        ctx.beat(step=self.step, policy_version=self.policy_version, status="finished")
        return {
            "mode": "async",
            "steps": self.step,
            "wall_s": round(time.monotonic() - self.started, 2),
            "rl_wall_s": round(time.monotonic() - self.rl_started, 2),
            "initial_accuracy": initial,
            "final_accuracy": final,
            "max_staleness": self.max_staleness_seen,
        }

    def close(self) -> None:
        self.metrics.close()
        self.trained_log.close()
        self.publisher.close()


def train(ctx: WorkerContext) -> None:
    trainer = Trainer(ctx)
    try:
        summary = trainer.run()
        (Path(ctx.config.run_dir) / "summary.json").write_text(json.dumps(summary))
    finally:
        trainer.close()


def main(argv: list[str] | None = None) -> int:
    return run_worker("trainer", argv, train)
