"""A trainer rank other than 0: it trains and publishes what rank 0 orders, nothing else.

It holds a replica of the model (DistributedDataParallel keeps it equal to rank 0's) and the
optimizer, and follows `llamarl.training.parallel.Order`s: `step` trains on this rank's share of the
groups (the gradients are summed over ranks inside the step), `publish` stages this rank's shard
of the version, which its publisher thread exposes to the generators and records in the store
(`put_version_shard`) for rank 0 to announce, `check` asks nothing (rank 0 checks that every rank
is there) and `stop` ends it. Sharded ranks (fsdp) also
`evaluate` beside rank 0 (its forward passes gather every rank's shards; the result is rank 0's
to report) and `checkpoint` (each writes its shards). It has no bus or ledger of its own: rank 0
keeps those, and the rest of each checkpoint, for the whole trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from llamarl.algorithms.overlong import OverlongShaping
from llamarl.engine.rollouts import train_group
from llamarl.observe.progress import Listener
from llamarl.roles.background import LatestOnly
from llamarl.roles.base import RoleResult
from llamarl.store import VersionGate
from llamarl.training.checkpoint import CheckpointStore
from llamarl.training.learner import Learner
from llamarl.training.parallel import TrainerRanks
from llamarl.training.sharded_checkpoint import save_shards
from llamarl.weightsync import Staged, WeightPublisher

log = structlog.get_logger(__name__)


class TrainerFollower:
    def __init__(
        self,
        ranks: TrainerRanks,
        learner: Learner,
        publisher: WeightPublisher[Any],
        store: VersionGate,
        timeout_s: float,
        evaluate: Callable[[Listener | None], object],
        checkpoints: CheckpointStore,
        overlong: OverlongShaping | None,
    ) -> None:
        self.ranks = ranks
        self.learner = learner
        self.publisher = publisher
        self.store = store
        self.timeout_s = timeout_s
        self.evaluate = evaluate
        self.checkpoints = checkpoints
        self.overlong = overlong
        """The run's overlong shaping, as rank 0 applies it: every rank shapes its groups alike."""
        self.steps = 0
        self.versions = LatestOnly("shard-publisher", self._publish, publisher.discard)

    def _publish(self, staged: Staged[Any]) -> None:
        meta = self.publisher.publish(staged)
        self.store.put_version_shard(self.ranks.rank, meta | {"policy_version": staged.policy_version})

    def start(self) -> None:
        """Nothing before the loop: rank 0's first order starts it."""

    def run(self) -> RoleResult:
        """Follow orders until rank 0 says stop; the steps trained."""
        model = self.learner.policy.model
        while True:
            self.versions.check()
            order = self.ranks.receive()
            if order.op == "stop":
                break
            if order.op == "step":
                self.learner.step([train_group(g, self.overlong) for g in order.groups])
                self.steps += 1
            elif order.op == "publish":
                self.versions.submit(self.publisher.stage(model, order.policy_version))
            elif order.op == "evaluate":
                self.evaluate(None)
            elif order.op == "checkpoint":
                save_shards(model, self.learner.optimizer, self.checkpoints.temp(order.step))
        self.versions.flush(self.timeout_s)
        log.info("trainer rank stopped", rank=self.ranks.rank, steps=self.steps)
        return RoleResult("trainer", f"rank{self.ranks.rank}", self.steps)

    def close(self) -> None:
        self.versions.close()
        self.publisher.close()
