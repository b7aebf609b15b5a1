"""The model and optimizer part of a sharded checkpoint (`trainer.sharding: fsdp`), with
torch.distributed.checkpoint.

Every rank writes its own shards of the weights and AdamW moments into CHECKPOINT/shards/ (one
file a rank, plus the metadata that maps each chunk to its place in the whole tensor); nothing
is gathered on one rank. Loading reshards: any number of ranks, one included (a process with no
group reads the whole tensors), reads the parts it holds from a checkpoint written by any other
number. The rest of the checkpoint (config and tokenizer, RNG states, counters, the buffer) is
rank 0's, as in `llamarl.training.checkpoint`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

SHARDS = "shards"
"""The directory of a checkpoint that holds the shards."""


def is_sharded(checkpoint: Path) -> bool:
    return (checkpoint / SHARDS).is_dir()


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    """Every rank at once (collective): this rank's part of the model and optimizer state."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    dcp.save(state, checkpoint_id=str(checkpoint / SHARDS))


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    """Every rank at once (or one process alone): the parts of the saved state this rank holds
    into the model and optimizer, whatever rank count wrote them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    with warnings.catch_warnings():  # one process without a group: torch says it reads alone
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(checkpoint / SHARDS))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """The whole saved weights into a model of the same architecture (export), read by this
    process alone, also when it is one rank of a group."""
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(checkpoint / SHARDS), no_dist=True)
    model.load_state_dict(state["model"])
