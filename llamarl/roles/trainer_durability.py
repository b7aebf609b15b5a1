"""The trainer's durability: checkpoints written off its path, and the resume that takes a run up
where the store and the newest checkpoint left it.

Checkpoints (`llamarl.training.checkpoint`) are written after the warm start, every
`trainer.checkpoint_every` steps and on a requested stop. A trainer resumes from the newest one of
its run: it publishes version max(checkpoint, store) + 1, so no version number is reused, and
rewinds the journal (RUN_DIR/trained.jsonl) to the checkpoint's step. The tickets trained after
that step, whose updates the crash lost, are reopened: those whose rollout is in the restored
buffer are trained from it, the others are reissued to generators, and so is every ticket issued
but not held (its rollout was lost with the trainer, or is a duplicate the trainer will refuse).
So every ticket's update is in the final model exactly once (or its ticket ended `dropped_stale`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
import torch

from llamarl.protocol import ScoredGroup
from llamarl.roles.background import LatestOnly
from llamarl.roles.journal import rewind
from llamarl.store import Store
from llamarl.training.checkpoint import CheckpointStore, Snapshot, TrainerState, take_snapshot
from llamarl.training.learner import Learner
from llamarl.training.parallel import Order, TrainerRanks
from llamarl.training.sharded_checkpoint import save_shards

log = structlog.get_logger(__name__)


def resume(
    store: Store,
    state: TrainerState | None,
    every_steps: int,
    lost: list[dict[str, Any]],
    source: str | None = None,
) -> tuple[int, list[ScoredGroup]] | None:
    """The version to publish next and the groups to train first, or None for a fresh run.
    `state` is the checkpoint's (from `source`), `lost` the journal entries past its step."""
    current = store.policy_version()
    if state is None and current < 0:
        return None
    checkpoint_version = state.policy_version if state is not None else 0
    policy_version = max(checkpoint_version, current) + 1
    # The model is the one of `trained` versions whatever numbers earlier resumes skipped; set
    # before the publish, so the gate is never wider than the trained versions allow.
    trained = (state.step if state is not None else 0) // every_steps
    store.set_version_offset(policy_version - trained)
    held = state.buffer if state is not None else []
    buffer = [g for g in held if store.reopen_ticket(g.group.ticket_id, requeue=False)]
    held_ids = {g.group.ticket_id for g in buffer}
    requeued = {e["ticket_id"] for e in lost} - held_ids
    for ticket_id in sorted(requeued):
        store.reopen_ticket(ticket_id, requeue=True)
    # The rollouts issued but not held died with the last trainer, or were on their way to it:
    # reissued now, not when their leases run out (`staleness.lease_s`, a minute by default).
    expired = store.expire_leases()
    log.warning(
        "resumed",
        checkpoint=source,
        step=state.step if state is not None else 0,
        policy_version=policy_version,
        buffered=len(buffer),
        requeued=len(requeued),
        leases_expired=expired,
    )
    return policy_version, buffer


SAMPLES_LOG = "samples.jsonl"
"""The held-out completions shown at each evaluation, a JSON line per evaluation."""


def rewind_logs(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """Roll the trainer's logs back to `step`; the journal entries that were past it."""
    rewind(run_dir / "metrics.jsonl", step)
    rewind(run_dir / SAMPLES_LOG, step)
    return rewind(run_dir / "trained.jsonl", step)


class Checkpointer:
    """Takes snapshots in the loop (memory copies) and writes them on a thread of its own; once one
    is on disk, the store's entries of the tickets it covers are compacted. A sharded trainer's
    ranks first write their shards in the loop, all at once (rank 0 orders the others to)."""

    def __init__(
        self,
        checkpoints: CheckpointStore,
        store: Store,
        every: int,
        sharded: bool = False,
        ranks: TrainerRanks | None = None,
    ) -> None:
        self.checkpoints = checkpoints
        self.store = store
        self.every = every
        self.sharded = sharded
        self.ranks = ranks
        self._writer = LatestOnly("checkpoint-writer", self._write)
        self._last_step = -1
        """The step of the last snapshot taken: a step's checkpoint is written once."""

    def save(self, learner: Learner, state: TrainerState, ended_below: int, always: bool = False) -> None:
        """Every ticket below `ended_below` has ended and is in this snapshot, so none of them can
        be reopened by a resume from it: their entries can go once it is on disk. `always`
        saves also when checkpoints are off (a sharded run's final model comes from one)."""
        if (not self.every and not always) or state.step == self._last_step:
            return
        self._last_step = state.step
        optimizer: torch.optim.Optimizer | None = learner.optimizer
        if self.sharded:
            temp = self.checkpoints.prepare(state.step)
            if self.ranks is not None:
                self.ranks.send(Order("checkpoint", step=state.step))
            save_shards(learner.policy.model, learner.optimizer, temp)
            optimizer = None
        snapshot = take_snapshot(learner.policy, learner.reference, optimizer, state)
        self._writer.submit((snapshot, ended_below))

    def _write(self, item: tuple[Snapshot, int]) -> None:
        snapshot, ended_below = item
        path = self.checkpoints.save(snapshot)
        floor = self.store.compact_tickets(ended_below)
        log.info("checkpoint", path=str(path), step=snapshot.state.step, ticket_floor=floor)

    def check(self) -> None:
        self._writer.check()

    def flush(self, timeout_s: float) -> None:
        self._writer.flush(timeout_s)

    def close(self) -> None:
        self._writer.close()
