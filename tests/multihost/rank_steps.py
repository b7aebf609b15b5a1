"""Three optimizer steps of a trainer's ranks on fixed groups, as torchrun starts them (one host
or several): `python -m torch.distributed.run ... -m tests.multihost.rank_steps SHARDING OUT`.
Every rank joins the group from torchrun's environment as a trainer rank does
(`TrainerRanks.from_env`); rank 0 writes the whole weights after the third step to OUT (.npy)."""

from __future__ import annotations

import sys

import numpy as np
import torch

from llamarl.config import AlgorithmConfig
from llamarl.engine.model import build_policy
from llamarl.training.learner import Learner
from llamarl.training.parallel import TrainerRanks
from tests.integration.test_trainer_ranks import (
    MODEL,
    TRAINER,
    full_weights,
    step_groups,
    uneven_groups,
)


def main(sharding: str, out: str) -> int:
    torch.set_num_threads(1)
    ranks = TrainerRanks.from_env("cpu", 120, "multihost")
    assert ranks is not None, "start under torchrun with several ranks"
    trainer = TRAINER.model_copy(update={"sharding": sharding})
    learner = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), trainer, 1.0, ranks=ranks)
    for _ in range(3):  # fsdp's lockstep is proven on ranks that cut unequal micro-batches
        learner.step(uneven_groups() if sharding == "fsdp" else step_groups())
    weights = full_weights(learner.policy.model)  # a collective under fsdp: every rank calls it
    if ranks.leader:
        np.save(out, weights)
    ranks.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
