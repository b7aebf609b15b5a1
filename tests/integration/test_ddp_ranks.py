"""Four DistributedDataParallel ranks (real gloo group of four spawned processes) whose groups
differ in shape: some ranks hold groups of one-token completions, whose forward pass is one
call where longer completions take two, so the ranks make different numbers of forward calls.
Replicas make no collective call in a forward pass (their buffers are not broadcast), so they
still meet in the one gradient reduction a step and take the one-process step. Four ranks hung
here when DDP broadcast the buffers in every forward call."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamarl.config import AlgorithmConfig
from llamarl.engine.grouped import micro_batches
from llamarl.engine.model import build_policy
from llamarl.training.learner import Learner
from llamarl.weightsync.flat import flatten
from tests.integration.test_trainer_ranks import (
    MODEL,
    TOLERANCE,
    TRAINER,
    join_group,
    run_ranks,
    uneven_groups,
)

WORLD = 4


def train_replica(rank: int, world: int, port: int, out: Any) -> None:
    """Three steps on the uneven groups from another seed's weights; the weights after them."""
    ranks = join_group(rank, world, port)
    learner = Learner(build_policy(MODEL, seed=1 + rank), AlgorithmConfig(), TRAINER, 1.0, ranks=ranks)
    for _ in range(3):
        learner.step(uneven_groups())
    out.put((rank, flatten(learner.policy.model, 1).buffer.numpy().copy()))
    ranks.close()


def test_four_replicas_with_one_token_groups_take_the_one_process_steps() -> None:
    groups = uneven_groups()
    shares = [groups[rank::WORLD] for rank in range(WORLD)]  # as TrainerRanks.mine deals them
    widths = [{group.width for group in share} for share in shares]
    assert {1} in widths and any(1 not in w for w in widths), "one rank only one-token groups, one none"
    assert all(micro_batches(share, TRAINER.micro_batch_tokens) for share in shares)
    alone = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), TRAINER, 1.0)
    for _ in range(3):
        alone.step(uneven_groups())
    expected = flatten(alone.policy.model, 1).buffer.numpy()
    results = run_ranks(WORLD, train_replica)
    for rank, weights in results:
        difference = np.abs(weights - expected).max()
        assert difference <= TOLERANCE * np.abs(expected).max(), f"rank {rank}: {difference}"
    assert all(np.array_equal(results[0][1], weights) for _, weights in results), "replicas drifted apart"
