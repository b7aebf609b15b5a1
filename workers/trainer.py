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

from llamarl.background import LatestOnly
from llamarl.bus import BusClient
from llamarl.checkpoint import CheckpointStore, Restored, Snapshot, TrainerState, take_snapshot
from llamarl.evaluate import accuracy
from llamarl.journal import rewind
from llamarl.learner import Learner
from llamarl.metrics import MetricsWriter
from llamarl.protocol import Control, ScoredGroup, VersionAnnouncement
from llamarl.rewards import make_verifier
from llamarl.rollouts import oldest_version, train_group
from llamarl.sync_run import prepare_policy
from llamarl.tasks import make_prompt_set
from llamarl.ticket_book import TicketBook
from llamarl.topics import CONTROL, SCORED, VERSIONS
from llamarl.weightsync.channel import Staged, WeightPublisher
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
        gen = config.generation
        self.learner = Learner(
            self.policy, config.algorithm, config.trainer, gen.temperature, reference,
            min_new_tokens=gen.min_new_tokens,
        )  # fmt: skip
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
        self.book = TicketBook()
        self.last: dict[str, Any] = {}
        self.rl_started = time.monotonic()
        # Publishing and checkpoint writing run on threads of their own (see llamarl.background).
        self._announce_bus: BusClient | None = None
        self.versions = LatestOnly("version-publisher", self._announce, self.publisher.discard)
        self.checkpointer = LatestOnly("checkpoint-writer", self._write_checkpoint)

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
        """Snapshot the state (memory copies) and write it on the checkpoint thread."""
        if not self.ctx.config.trainer.checkpoint_every:
            return
        started = time.monotonic()
        counters: dict[str, float] = {"max_staleness_seen": self.max_staleness_seen}
        if self.initial_accuracy is not None:
            counters["initial_accuracy"] = self.initial_accuracy
        state = TrainerState(self.step, self.policy_version, counters, list(self.buffer))
        snapshot = take_snapshot(self.policy, self.learner.reference, self.learner.optimizer, state)
        # Every ticket below the book's floor has ended and is in this snapshot, so none of them
        # can be reopened by a resume from it: their entries can go once it is on disk.
        self.checkpointer.submit((snapshot, self.book.floor))
        self.ctx.add_time("checkpoint_s", started)

    def _write_checkpoint(self, item: tuple[Snapshot, int]) -> None:
        snapshot, ended_below = item
        path = self.checkpoints.save(snapshot)
        floor = self.ctx.store.compact_tickets(ended_below)
        log.info("checkpoint", path=str(path), step=snapshot.state.step, ticket_floor=floor)

    def evaluate(self) -> float:
        gen = self.ctx.config.generation
        return accuracy(
            self.policy, self.held_out, self.verifier, gen.max_new_tokens, gen.min_new_tokens
        )

    def publish(self) -> None:
        """Stage the current version (one copy of the weights) for the publisher thread."""
        started = time.monotonic()
        self.versions.submit(self.publisher.stage(self.policy.model, self.policy_version))
        self.ctx.add_time("stage_s", started)
        structlog.contextvars.bind_contextvars(policy_version=self.policy_version)

    def _announce(self, staged: Staged) -> None:
        """On the publisher thread: checksum and expose, record in Redis, announce on the bus."""
        meta = self.publisher.publish(staged)
        self.ctx.store.publish_version(staged.policy_version, meta)
        if self._announce_bus is None:
            self._announce_bus = self.ctx.connect_bus()
        announcement = VersionAnnouncement(
            policy_version=staged.policy_version,
            num_bytes=staged.num_bytes,
            checksum=str(meta["checksum"]),
            transport=str(meta["transport"]),
            endpoint=str(meta["endpoint"]),
        )
        self._announce_bus.publish(VERSIONS, announcement, staged.policy_version)

    def _count(self, name: str, amount: int = 1) -> None:
        self.ctx.counters[name] = self.ctx.counters.get(name, 0) + amount

    def admit(self, scored: ScoredGroup) -> None:
        """Buffer a scored group unless its ticket has ended or is buffered already (a late
        duplicate of a reissued ticket); decided locally, see llamarl.ticket_book."""
        ticket_id = scored.group.ticket_id
        if self.book.has_ended(ticket_id) or any(
            item.group.ticket_id == ticket_id for item in self.buffer
        ):
            self._count("duplicate_groups")
            return
        self.buffer.append(scored)

    def drop_stale(self) -> None:
        limit = self.ctx.config.staleness.max_staleness
        stale = [g for g in self.buffer if self.policy_version - oldest_version(g.group) > limit]
        if not stale:
            return
        self.buffer = [g for g in self.buffer if g not in stale]
        ids = [g.group.ticket_id for g in stale]
        self.ctx.store.end_tickets([(i, "dropped_stale") for i in ids])
        self.book.mark(ids)
        self._count("dropped_stale", len(ids))

    def train_step(self) -> None:
        config = self.ctx.config
        size = config.trainer.prompts_per_step
        batch, self.buffer = self.buffer[:size], self.buffer[size:]
        staleness = [self.policy_version - oldest_version(item.group) for item in batch]
        self.ctx.timer.busy()
        record: dict[str, Any] = {"step": self.step + 1, "policy_version": self.policy_version}
        started = time.monotonic()
        record |= self.learner.step([train_group(item) for item in batch])
        record["train_s"] = self.ctx.add_time("train_s", started)
        self.step += 1
        if self.step % config.sync.every_steps == 0:
            self.policy_version += 1
            self.publish()
        for item, lag in zip(batch, staleness, strict=True):
            entry = {"ticket_id": item.group.ticket_id, "rollout_id": item.group.rollout_id}
            self.trained_log.write(json.dumps(entry | {"staleness": lag, "step": self.step}) + "\n")
        self.trained_log.flush()  # before the tickets end: a crash never ends one it lacks
        self.max_staleness_seen = max([self.max_staleness_seen, *staleness])
        record |= {
            "staleness_max": max(staleness),
            "staleness_mean": sum(staleness) / len(staleness),
        }
        started = time.monotonic()
        ids = [item.group.ticket_id for item in batch]
        beat = self.ctx.step_beat(**self._status(record))
        ended = self.ctx.store.end_tickets([(i, "trained") for i in ids], heartbeat=beat)
        self.book.mark(ids)
        self._count("finish_conflicts", ended.count(False))
        record["redis_s"] = self.ctx.add_time("redis_s", started)
        if self.step % config.trainer.eval_every == 0 or self.step == config.trainer.num_steps:
            started = time.monotonic()
            record["held_out_accuracy"] = self.evaluate()
            record["eval_s"] = self.ctx.add_time("eval_s", started)
        if self.step % max(config.trainer.checkpoint_every, 1) == 0:
            self.save_checkpoint()
        self.ctx.timer.idle()
        record["wall_s"] = time.monotonic() - self.started
        record["rl_s"] = time.monotonic() - self.rl_started
        self.metrics.write(record)
        self.last = record

    def _status(self, record: dict[str, Any]) -> dict[str, Any]:
        """The heartbeat fields the progress line and `llamarl monitor` show."""
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "reward_mean": record.get("reward_mean", self.last.get("reward_mean", 0.0)),
            "held_out_accuracy": self.last.get("held_out_accuracy", self.initial_accuracy or 0.0),
            "max_staleness": self.max_staleness_seen,
        }

    def run(self) -> dict[str, Any]:
        ctx = self.ctx
        config = ctx.config
        pps = config.trainer.prompts_per_step
        self.resume(self.restored)
        self.book = TicketBook(*ctx.store.ended_tickets())
        self.publish()
        if self.initial_accuracy is None:
            self.initial_accuracy = self.evaluate()
            self.save_checkpoint()
        initial = self.initial_accuracy
        self.rl_started = time.monotonic()
        # Credit for a step's groups and the next step's, so none that are ready wait upstream.
        credit = config.broker.consumer_credit or pps * (config.staleness.max_staleness + 1)
        consumer = ctx.bus.consume(SCORED, credit=credit)
        final = initial
        while self.step < config.trainer.num_steps and not ctx.stopping:
            self.versions.check()
            self.checkpointer.check()
            ctx.beat(**self._status(self.last))
            short = len(self.buffer) < pps
            started = time.monotonic()
            envelope = consumer.recv(POLL_MS if short else 0)
            while envelope is not None:
                self.admit(envelope.payload)
                envelope = consumer.recv(0)
            if short:
                self.ctx.add_time("wait_s", started)
            self.drop_stale()
            if len(self.buffer) >= pps:
                self.train_step()
                final = self.last.get("held_out_accuracy", final)
        if self.step < config.trainer.num_steps:
            self.save_checkpoint()  # asked to stop: resume later without losing a step
        self.checkpointer.flush(config.sync.timeout_s)
        self.versions.flush(config.sync.timeout_s)
        if self.step >= config.trainer.num_steps:
            ctx.store.set_run_status("finished")
            stop = Control("stop", {"reason": "trainer finished"})
            ctx.bus.publish(CONTROL, stop, self.policy_version)
        ctx.counters["bus_s"] = ctx.bus.busy_s
        return {
            "mode": "async",
            "steps": self.step,
            "wall_s": round(time.monotonic() - self.started, 2),
            "rl_wall_s": round(time.monotonic() - self.rl_started, 2),
            "eval_s": round(ctx.counters.get("eval_s", 0.0), 2),
            "initial_accuracy": initial,
            "final_accuracy": final,
            "max_staleness": self.max_staleness_seen,
        }

    def close(self) -> None:
        self.versions.close()
        self.checkpointer.close()
        if self._announce_bus is not None:
            self._announce_bus.close()
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
