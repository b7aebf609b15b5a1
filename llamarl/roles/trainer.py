"""The trainer: gather scored groups, enforce staleness, train, publish versions.

A group whose oldest token is more than `max_staleness` versions behind the trainer's version at
the time of use is dropped and its ticket ended as `dropped_stale`; with dynamic sampling a group
with no signal is skipped and its ticket ended as `skipped` (`llamarl.roles.group_signal`), as is
one refused for its reward, which no redo would fix (`llamarl.roles.admission`); every
trained group ends its ticket as `trained` (exactly once, by the store's compare-and-set), shaped
by overlong shaping when it is on (`llamarl.algorithms.overlong`). Each trained group is also
written to RUN_DIR/trained.jsonl (ticket, rollout id, staleness) so a run can be audited; the line
is written before the ticket is ended, so a crash never ends a ticket that the journal lacks.
Checkpoints and resume: `llamarl.roles.trainer_durability`. A new version is staged (one copy of
the weights) in the loop and checksummed, exposed, recorded and announced on a thread of its own.

With several ranks (`llamarl.training.parallel`) this is rank 0: it orders the other ranks to train each
step's groups and to publish each version (`llamarl.roles.trainer_follower`), and sharded ranks
(fsdp) also to evaluate and to write their shards of each checkpoint; it publishes its own
shard, and announces a version once every rank has recorded its shard in the store. A sharded
run's final model is put together from its last checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from llamarl.algorithms.overlong import overlong_shaping
from llamarl.bus import Bus, WorkQueue
from llamarl.engine.rollouts import (
    component_means,
    oldest_version,
    shaped_rewards,
    train_group,
)
from llamarl.errors import ProtocolError
from llamarl.observe.metric_sinks import make_metrics
from llamarl.protocol import Control, ScoredGroup, VersionAnnouncement
from llamarl.roles.admission import check_scored
from llamarl.roles.background import LatestOnly
from llamarl.roles.base import RoleResult
from llamarl.roles.group_signal import SignalFilter
from llamarl.roles.held_out import TrainerEvaluations
from llamarl.roles.runtime import RoleRuntime
from llamarl.roles.set_aside import SetAside
from llamarl.roles.ticket_book import TicketBook
from llamarl.roles.trainer_durability import Checkpointer, resume, rewind_logs
from llamarl.roles.trainer_evaluations import EvaluationLog
from llamarl.topics import CONTROL, SCORED, VERSIONS
from llamarl.training.checkpoint import Restored, TrainerState
from llamarl.training.evaluate import Evaluation
from llamarl.training.export import FINAL_MODEL, checkpoint_model, save_final
from llamarl.training.learner import Learner
from llamarl.training.parallel import Order, TrainerRanks
from llamarl.weightsync import Staged, WeightPublisher
from llamarl.weightsync.messages import joined_shards

log = structlog.get_logger(__name__)
ENV_FAILURES_IN_A_ROW = 50
"""Groups whose environment raised (or whose reward was refused), one after another, before the
run gives up on it."""
POLL_MS = 20


class Trainer:
    def __init__(
        self,
        runtime: RoleRuntime,
        learner: Learner,
        publisher: WeightPublisher,
        checkpointer: Checkpointer,
        evaluate: Callable[[], Evaluation],
        restored: Restored | None,
        started: float,
        ranks: TrainerRanks | None = None,
        shared: TrainerEvaluations | None = None,
    ) -> None:
        self.runtime = runtime
        self.shared = shared
        """Evaluations shared with the generators (`llamarl.roles.held_out`); None: this
        trainer makes them all."""
        self.ranks = ranks
        self.started = started
        """When the trainer's wall clock (`wall_s`) starts: before its model was built."""
        self.learner = learner
        self.policy = learner.policy
        self.vocab_size = int(self.policy.model.config.vocab_size)
        self.publisher = publisher
        self.checkpointer = checkpointer
        self.evaluate = evaluate
        self.restored = restored
        state = restored.state if restored is not None else TrainerState(0, 0)
        self.step = state.step
        self.policy_version = state.policy_version
        self.max_staleness_seen = int(state.counters.get("max_staleness_seen", 0))
        run_dir = Path(runtime.config.run_dir)
        self.lost = rewind_logs(run_dir, self.step)
        self.metrics = make_metrics(runtime.config)
        self.trained_log = (run_dir / "trained.jsonl").open("a")
        self.evaluations = EvaluationLog(run_dir, state.counters)
        self.buffer: list[ScoredGroup] = []
        config = runtime.config
        self.overlong = overlong_shaping(config.sampling, config.generation.max_new_tokens, self.policy.eos_id)
        self.signal = SignalFilter.of(config)
        self.aside = SetAside(runtime, ENV_FAILURES_IN_A_ROW)
        self.book = TicketBook()
        self.last: dict[str, Any] = {}
        self.rl_started = self.started
        self.scored: WorkQueue | None = None
        self._announce_bus: Bus | None = None
        self.versions = LatestOnly("version-publisher", self._announce, publisher.discard)

    def save_checkpoint(self, always: bool = False) -> None:
        started = self.runtime.clock()
        counters = {"max_staleness_seen": self.max_staleness_seen} | self.evaluations.counters()
        if self.shared is not None:
            counters |= self.shared.counters()
        state = TrainerState(self.step, self.policy_version, counters, list(self.buffer))
        self.checkpointer.save(self.learner, state, self.book.floor, always)
        self.runtime.add_time("checkpoint_s", started)

    def publish(self) -> None:
        """Stage the current version (one copy of the weights) for the publisher thread."""
        started = self.runtime.clock()
        if self.ranks is not None:
            self.ranks.send(Order("publish", policy_version=self.policy_version))
        self.versions.submit(self.publisher.stage(self.policy.model, self.policy_version))
        self.runtime.add_time("stage_s", started)
        structlog.contextvars.bind_contextvars(policy_version=self.policy_version)

    def _announce(self, staged: Staged) -> None:
        """On the publisher thread: checksum and expose, record in the store, announce."""
        meta = self.publisher.publish(staged)
        if self.ranks is not None:
            timeout_s = self.runtime.config.sync.timeout_s
            joined = joined_shards(
                self.runtime.store.version_shards, self.ranks.world, staged.policy_version, meta, timeout_s
            )
            if joined is None:  # a rank skipped to a newer version: that one is announced next
                return
            meta = joined
        self.runtime.store.publish_version(staged.policy_version, meta)
        if self._announce_bus is None:
            self._announce_bus = self.runtime.connect_bus()
        announcement = VersionAnnouncement(
            policy_version=staged.policy_version,
            num_bytes=int(meta["num_bytes"]),
            checksum=str(meta["checksum"]),
            transport=str(meta["transport"]),
            endpoint=str(meta["endpoint"]),
            layout=str(meta["layout"]),
        )
        self._announce_bus.publish(VERSIONS, announcement, staged.policy_version)

    def start(self) -> None:
        """Resume (or start fresh), publish the first version, evaluate the starting policy."""
        runtime = self.runtime
        restored = self.restored
        resumed = resume(
            runtime.store,
            restored.state if restored is not None else None,
            runtime.config.sync.every_steps,
            self.lost,
            str(restored.path) if restored is not None else None,
        )
        if resumed is not None:
            self.policy_version, self.buffer = resumed
            runtime.counters["resumes"] = 1
        self.book = TicketBook(*runtime.store.ended_tickets())
        self.publish()
        if self.evaluations.initial_accuracy is None:
            self.evaluations.own(self.step, self._evaluate(), before_rl=True)
            self.save_checkpoint()
        else:
            self.evaluations.resumed()
        self.rl_started = runtime.clock()
        config = runtime.config
        # Credit for a step's groups and the next step's, so none that are ready wait upstream.
        pps = config.trainer.prompts_per_step
        credit = config.broker.consumer_credit or pps * (config.staleness.max_staleness + 1)
        self.scored = runtime.bus.consume(SCORED, credit=credit)

    def admit(self, scored: ScoredGroup) -> None:
        """Buffer a scored group unless it fails the door's checks (`llamarl.roles.admission`,
        counted by reason), its ticket has ended or is buffered already (a late duplicate of a
        reissued ticket; decided locally, see llamarl.roles.ticket_book), or it is set aside
        (`llamarl.roles.set_aside`): dynamic sampling skips it, one of its episodes' environment
        raised, or the door refused it for its reward."""
        ticket_id = scored.group.ticket_id
        try:
            check_scored(scored, self.vocab_size, self.policy_version)
        except ProtocolError as err:
            self.runtime.rejections.record(err.reason, str(err))
            self.runtime.count("refused_groups")
            # A redo cannot fix a reward (its scorer would give it again): set aside, not redone
            # forever; any other refusal leaves the ticket open for its lease to lapse.
            if err.reason == "bad_reward" and not self.holds(ticket_id):
                self.aside.bad_reward(err)
                self.set_aside(ticket_id)
            return
        self.aside.passed()
        if self.holds(ticket_id):
            self.runtime.count("duplicate_groups")
            return
        failed = scored.group.episodes and self.aside.env_failed(scored)
        if failed or (self.signal.enabled and self.signal.skips(shaped_rewards(scored, self.overlong))):
            self.set_aside(ticket_id)
            return
        self.buffer.append(scored)

    def holds(self, ticket_id: int) -> bool:
        """Whether the ticket has ended or its group is buffered already."""
        return self.book.has_ended(ticket_id) or any(item.group.ticket_id == ticket_id for item in self.buffer)

    def set_aside(self, ticket_id: int) -> None:
        self.aside.add(ticket_id)
        self.book.mark([ticket_id])

    @property
    def num_set_aside(self) -> int:
        return self.aside.num_set_aside

    def drop_stale(self) -> None:
        limit = self.runtime.config.staleness.max_staleness
        stale = [g for g in self.buffer if self.policy_version - oldest_version(g.group) > limit]
        if not stale:
            return
        self.buffer = [g for g in self.buffer if g not in stale]
        ids = [g.group.ticket_id for g in stale]
        self.runtime.store.end_tickets([(i, "dropped_stale") for i in ids])
        self.book.mark(ids)
        self.runtime.count("dropped_stale", len(ids))

    def gather(self, timeout_ms: int) -> bool:
        """Take the scored groups waiting (the first wait up to `timeout_ms`), end the skipped,
        drop the stale; True when a step's worth is buffered."""
        assert self.scored is not None, "start() first"
        envelope = self.scored.recv(timeout_ms)
        while envelope is not None:
            self.admit(envelope.payload)
            envelope = self.scored.recv(0)
        self.aside.end()
        self.drop_stale()
        return len(self.buffer) >= self.runtime.config.trainer.prompts_per_step

    def train_step(self, extra: dict[str, float] | None = None, step_started: float | None = None) -> dict[str, Any]:
        """Train on a step's worth of the buffer; the step's metrics record, with `extra` and,
        given when the caller's whole step began, `step_s` and `tokens_per_s`."""
        runtime = self.runtime
        config = runtime.config
        size = config.trainer.prompts_per_step
        batch, self.buffer = self.buffer[:size], self.buffer[size:]
        staleness = [self.policy_version - oldest_version(item.group) for item in batch]
        runtime.timer.busy()
        record: dict[str, Any] = {"step": self.step + 1, "policy_version": self.policy_version}
        started = runtime.clock()
        if self.ranks is not None:
            self.ranks.send(Order("step", step=self.step + 1, groups=tuple(batch)))
        with runtime.keep_alive("running", beat_now=False):  # an LLM's step can outlast the TTL
            record |= self.learner.step([train_group(item, self.overlong) for item in batch])
        record |= component_means(batch)
        record["train_s"] = runtime.add_time("train_s", started)
        if self.signal.enabled:
            record["groups_skipped"] = self.signal.step_done()
        self.step += 1
        if self.step % config.sync.every_steps == 0:
            self.policy_version += 1
            if self.shared is not None:  # before it is announced: generators may join in
                self.shared.open_if_due(self.step, self.policy_version)
            self.publish()
        self._journal(batch, staleness)
        started = runtime.clock()
        ids = [item.group.ticket_id for item in batch]
        beat = runtime.step_beat(**self._status(record))
        ended = runtime.store.end_tickets([(i, "trained") for i in ids], heartbeat=beat)
        self.book.mark(ids)
        runtime.count("finish_conflicts", ended.count(False))
        record["redis_s"] = runtime.add_time("redis_s", started)
        last = self.step == config.trainer.num_steps
        if self.shared is not None:  # the last step's record holds the trainer's own evaluation
            for held_out in self.shared.take(config.sync.timeout_s if last else 0.0):
                self.evaluations.shared({} if last else record, held_out)
            started = runtime.clock()
            if self.shared.take_part(self.policy_version):
                record["eval_s"] = runtime.add_time("eval_s", started)
        if last or (self.shared is None and self.step % config.trainer.eval_every == 0):
            started = runtime.clock()
            record |= self.evaluations.own(self.step, self._evaluate())
            record["eval_s"] = runtime.add_time("eval_s", started)
        if self.step % max(config.trainer.checkpoint_every, 1) == 0:
            self.save_checkpoint()
        runtime.timer.idle()
        record |= extra or {}
        if step_started is not None:
            record["step_s"] = runtime.clock() - step_started
            record["tokens_per_s"] = record["num_tokens"] / record["step_s"]
        record["wall_s"] = runtime.clock() - self.started
        record["rl_s"] = runtime.clock() - self.rl_started
        self.metrics.write(record)
        self.last = record
        return record

    def _journal(self, batch: list[ScoredGroup], staleness: list[int]) -> None:
        for item, lag in zip(batch, staleness, strict=True):
            entry = {"ticket_id": item.group.ticket_id, "rollout_id": item.group.rollout_id}
            self.trained_log.write(json.dumps(entry | {"staleness": lag, "step": self.step}) + "\n")
        self.trained_log.flush()  # before the tickets end: a crash never ends one it lacks
        self.max_staleness_seen = max([self.max_staleness_seen, *staleness])

    def _evaluate(self) -> Evaluation:
        """The trainer's own evaluation (sharded ranks all at once)."""
        if self.ranks is not None and self.checkpointer.sharded:
            self.ranks.send(Order("evaluate"))
        return self.evaluate()

    def _status(self, record: dict[str, Any]) -> dict[str, Any]:
        """The heartbeat fields the progress line and `llamarl monitor` show."""
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "reward_mean": record.get("reward_mean", self.last.get("reward_mean", 0.0)),
            "held_out_accuracy": self.evaluations.final_accuracy or 0.0,  # the latest one's
            "max_staleness": self.max_staleness_seen,
            **self.evaluations.final_sets,  # the named sets' latest metrics
        }

    @property
    def done(self) -> bool:
        return self.step >= self.runtime.config.trainer.num_steps

    def check_background(self) -> None:
        """Raise what failed on the publisher or checkpoint thread."""
        self.versions.check()
        self.checkpointer.check()

    def run(self) -> RoleResult:
        """The async loop (after `start`); the synchronous baseline drives `gather`,
        `train_step` and `finish` itself."""
        runtime = self.runtime
        while not self.done and not runtime.stopping:
            self.check_background()
            runtime.beat(**self._status(self.last))
            short = len(self.buffer) < runtime.config.trainer.prompts_per_step
            started = runtime.clock()
            ready = self.gather(POLL_MS if short else 0)
            if short:
                runtime.add_time("wait_s", started)
            if ready:
                self.train_step()
            elif self.ranks is not None:
                self.ranks.check_ranks(runtime.config.workers.heartbeat_s)
        summary = self.finish("async")
        return RoleResult(runtime.role, runtime.worker_id, self.step, summary)

    def finish(self, mode: str) -> dict[str, Any]:
        """Checkpoint a stopped run, wait for the background work, end a finished run (its
        final model saved to RUN_DIR/model, then the run marked finished in the store); the
        run's summary, also written to RUN_DIR/summary.json."""
        runtime = self.runtime
        timeout_s = runtime.config.sync.timeout_s
        sharded = self.checkpointer.sharded
        if not self.done or sharded:  # a sharded model is put together from its checkpoint
            self.save_checkpoint(always=True)  # or asked to stop: resume without losing a step
        self.checkpointer.flush(timeout_s)
        self.versions.flush(timeout_s)
        run_dir = Path(runtime.config.run_dir)
        model_dir = run_dir / FINAL_MODEL
        if self.done:
            final = self.policy
            if sharded:
                final = checkpoint_model(self.checkpointer.checkpoints.target(self.step))
            save_final(final, run_dir)
        runtime.counters["bus_s"] = runtime.bus.busy_s
        summary = {
            "mode": mode,
            "steps": self.step,
            "wall_s": round(runtime.clock() - self.started, 2),
            "rl_wall_s": round(runtime.clock() - self.rl_started, 2),
            "eval_s": round(runtime.counters.get("eval_s", 0.0), 2),
            **self.evaluations.summary(),
            "max_staleness": self.max_staleness_seen,
            "model": str(model_dir) if self.done else None,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
        if self.done:  # once its summary is written: a trainer started on a finished run exits
            runtime.store.set_run_status("finished")
            runtime.bus.publish(CONTROL, Control("stop", {"reason": "trainer finished"}), self.policy_version)
        return summary

    def close(self) -> None:
        if self.ranks is not None:  # the other ranks end with this one
            self.ranks.stop_others()
        self.versions.close()
        self.checkpointer.close()
        if self._announce_bus is not None:
            self._announce_bus.close()
        self.metrics.close()
        self.trained_log.close()
        self.evaluations.close()
        self.publisher.close()
