"""How the trainer's ranks hold the model: whole replicas (`Replicas`, DistributedDataParallel)
or shards (`Shards`, FSDP2), and activation checkpointing for either.

`Shards` applies `torch.distributed.fsdp.fully_shard` to every decoder block (the classes a
Hugging Face model names in `_no_split_modules`) and then to the root, so each rank keeps the
dim-0 chunk of every parameter, its gradient and its AdamW moments: 1/ranks of the training
state. A block's weights are gathered for its forward and backward only. On CUDA the blocks
compute in bfloat16 with float32 master weights and float32 gradient reduction, and
`trainer.offload` keeps the state in CPU memory between uses. Sharded ranks take each block
once per micro-batch (`one_pass`: the prompt repeated for each completion, `engine.grouped`), so
a block's whole gradients are reduce-scattered and freed as soon as its backward is done.
Replicas reduce the gradients once a step, in the last micro-batch's backward; shards do too by
default, or in every micro-batch's (`trainer.reduce_gradients: micro_batch`), which keeps only
each rank's shard of the gradients between micro-batches where accumulating holds them whole.

Activation checkpointing wraps each block (before sharding, so FSDP's hooks sit outside the
recomputation, as torchtitan does): its activations are recomputed in the backward pass instead
of kept. The wrapper's state_dict hooks keep the parameter names unchanged.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from llamarl.config import TrainerConfig


def block_names(model: torch.nn.Module) -> set[str]:
    """The class names of the model's repeated blocks (`_no_split_modules`, also under a peft
    wrapper); empty for a model that names none."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    return set()


def _block_slots(model: torch.nn.Module) -> Iterator[tuple[torch.nn.ModuleList, int]]:
    names = block_names(model)
    for module in list(model.modules()):
        if isinstance(module, torch.nn.ModuleList):
            for index, child in enumerate(module):
                if type(child).__name__ in names:
                    yield module, index


def checkpoint_activations(model: torch.nn.Module) -> int:
    """Wrap every block so its activations are recomputed in backward; the blocks wrapped."""
    slots = list(_block_slots(model))
    for blocks, index in slots:
        blocks[index] = checkpoint_wrapper(blocks[index])
    return len(slots)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's blocks (each as checkpoint-wrapped, where it is)."""
    names = block_names(model)
    found = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            found += [c for c in module if type(_unwrapped(c)).__name__ in names]
    return found


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    return getattr(module, "_checkpoint_wrapped_module", module)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class DataParallel(ABC):
    """How a model is spread over the trainer's ranks."""

    lockstep: bool
    """Every forward and backward pass is collective (the ranks gather each block's shards), so
    every rank takes as many as the others."""
    one_pass: bool
    """Each block is taken once per micro-batch (the prompt repeated for each completion rather
    than computed once and shared), so its whole gradients can be freed once its backward is
    done."""

    @abstractmethod
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the loss is computed with (`model` itself when it is changed in place)."""

    @abstractmethod
    def gradient_sync(self, wrapped: torch.nn.Module, last: bool) -> Any:
        """A context for one micro-batch's backward: gradients are reduced in the last one only."""


class Replicas(DataParallel):
    """Every rank a whole replica under DistributedDataParallel (whose constructor gives every
    rank rank 0's weights). Its buffers (rotary frequencies) are computed alike on every rank and
    not broadcast in each forward call: ranks make different numbers of forward calls (a group
    of one-token completions takes one, a longer one two), and a broadcast per call would pair
    one rank's with another's next and hang the group."""

    lockstep = False
    one_pass = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def gradient_sync(self, wrapped: torch.nn.Module, last: bool) -> Any:
        if last:
            return contextlib.nullcontext()
        return wrapped.no_sync()  # type: ignore[operator]


class Shards(DataParallel):
    """FSDP2 over the default process group; every rank keeps its chunk of rank 0's weights."""

    lockstep = True
    one_pass = True

    def __init__(self, device: torch.device, config: TrainerConfig) -> None:
        self.options: dict[str, Any] = {}
        if device.type == "cuda":
            self.options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if config.offload:
                self.options["offload_policy"] = CPUOffloadPolicy()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Shard `model` in place, from rank 0's weights (as DistributedDataParallel does)."""
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, 0)
        for block in blocks(model):
            fully_shard(block, **self.options)
        fully_shard(model, **self.options)
        return model

    def gradient_sync(self, wrapped: torch.nn.Module, last: bool) -> Any:
        wrapped.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()


def data_parallel(config: TrainerConfig, device: torch.device) -> DataParallel:
    return Shards(device, config) if config.sharding == "fsdp" else Replicas(device)
