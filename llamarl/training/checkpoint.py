"""Trainer checkpoints: model, optimizer, RNG states, step, policy version and the buffer.

Layout of one checkpoint, RUN_DIR/checkpoints/step-00000020/:
  model/           the policy, `save_pretrained` (safetensors) with its tokenizer
  reference/       the KL reference model, only when one is used
  optimizer.pt     optimizer state dict, read back with `torch.load(weights_only=True)`
  rng.pt           torch CPU RNG state (same loader)
  state.json       run_id, step, policy_version, python RNG state and the trainer's counters
  buffer.msgpack   scored groups held but not yet trained, each a wire-protocol envelope
A sharded trainer (fsdp) writes `model/` without weights (config and tokenizer, and the adapters'
adapter_config.json with LoRA) and no optimizer.pt: every rank writes its part of both into
shards/ (`llamarl.training.sharded_checkpoint`) before rank 0 writes the rest. With LoRA
adapters (and replicas) `adapter/` (a peft adapter directory) takes the place of `model/`; their
frozen base is written once, to checkpoints/base/.
It is written into a `.tmp` directory, fsynced, then renamed: a directory without the suffix is
always complete. Only the newest `keep` checkpoints stay on disk. Nothing here unpickles.
`take_snapshot` copies the state between two optimizer steps (memory only), so the writing can
run on a background thread while training goes on.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import torch

from llamarl.engine.adapters import (
    ADAPTER_CONFIG,
    adapter_state,
    has_adapters,
    load_adapters,
    save_adapter_config,
    save_adapters,
)
from llamarl.engine.model import (
    Policy,
    architecture_of,
    load_policy,
    save_architecture,
    save_policy,
)
from llamarl.errors import ConfigError
from llamarl.protocol import ScoredGroup, decode, encode, make_envelope
from llamarl.training.sharded_checkpoint import is_sharded

PREFIX = "step-"
TMP = ".tmp"
MAX_GROUP_BYTES = 1 << 30


@dataclass
class TrainerState:
    """The scalars and buffer a trainer needs to carry on where it stopped."""

    step: int
    policy_version: int
    counters: dict[str, float] = field(default_factory=dict)
    buffer: list[ScoredGroup] = field(default_factory=list)


@dataclass
class Snapshot:
    """Copies of everything a checkpoint holds, taken between two optimizer steps, so it can be
    written on another thread while training goes on."""

    policy: Policy
    """Model (for its config) and tokenizer; the weights written are `model_state`."""
    model_state: dict[str, torch.Tensor] | None
    """None when the ranks wrote model and optimizer into shards/ already."""
    reference: Policy | None
    optimizer_state: dict[str, Any] | None
    torch_rng: torch.Tensor
    python_rng: Any
    state: TrainerState


def clone_tensors(tree: Any, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """A deep copy of the tensors in nested dicts and lists; tensors that shared storage (tied
    weights) share it in the copy too."""
    memo = {} if memo is None else memo
    if isinstance(tree, torch.Tensor):
        key = tree.data_ptr()
        if key not in memo:
            memo[key] = tree.detach().clone()
        return memo[key]
    if isinstance(tree, dict):
        return {k: clone_tensors(v, memo) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(clone_tensors(v, memo) for v in tree)
    return tree


def take_snapshot(
    policy: Policy,
    reference: Policy | None,
    optimizer: torch.optim.Optimizer | None,
    state: TrainerState,
) -> Snapshot:
    """Copy the trainer's state (memory copies only; the slow part is `CheckpointStore.save`);
    without `optimizer`, neither weights nor optimizer state (the ranks wrote shards)."""
    model_state = None
    if optimizer is not None:
        model = policy.model
        model_state = adapter_state(model) if has_adapters(model) else clone_tensors(model.state_dict())
    return Snapshot(
        policy=policy,
        model_state=model_state,
        reference=reference,
        optimizer_state=clone_tensors(optimizer.state_dict()) if optimizer is not None else None,
        torch_rng=torch.get_rng_state(),
        python_rng=random.getstate(),
        state=TrainerState(state.step, state.policy_version, dict(state.counters), list(state.buffer)),
    )


@dataclass
class Restored:
    path: Path
    policy: Policy
    """With `sharded`, only the architecture and tokenizer: the weights are in shards/."""
    reference: Policy | None
    optimizer_state: dict[str, Any] | None
    state: TrainerState

    @property
    def sharded(self) -> bool:
        return self.optimizer_state is None


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class CheckpointStore:
    """The checkpoints of one run in one directory."""

    def __init__(self, root: str | Path, run_id: str, keep: int) -> None:
        self.root = Path(root)
        self.run_id = run_id
        self.keep = keep

    def complete(self) -> list[Path]:
        """Finished checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.glob(f"{PREFIX}*") if p.is_dir() and p.suffix != TMP]
        return sorted(found, key=lambda p: int(p.name.removeprefix(PREFIX)))

    def latest(self) -> Path | None:
        found = self.complete()
        return found[-1] if found else None

    def target(self, step: int) -> Path:
        return self.root / f"{PREFIX}{step:08d}"

    def temp(self, step: int) -> Path:
        """Where the checkpoint of `step` is written before it is complete."""
        return self.target(step).with_suffix(TMP)

    def prepare(self, step: int) -> Path:
        """An empty directory for the checkpoint of `step` (rank 0, before the ranks write
        their shards into it)."""
        temp = self.temp(step)
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        return temp

    def save(self, snapshot: Snapshot) -> Path:
        """Write a snapshot (any thread), fsync it and rename it into place; a snapshot without
        weights completes the directory the ranks wrote their shards into."""
        state = snapshot.state
        target, temp = self.target(state.step), self.temp(state.step)
        if snapshot.model_state is not None:
            self.prepare(state.step)
        adapters = has_adapters(snapshot.policy.model)
        if snapshot.model_state is None:
            save_architecture(snapshot.policy, temp / "model")
            if adapters:
                save_adapter_config(snapshot.policy, temp / "model")
        elif adapters:
            save_adapters(snapshot.policy, temp / "adapter", snapshot.model_state)
        else:
            save_policy(snapshot.policy, temp / "model", snapshot.model_state)
        if snapshot.reference is not None:
            save_policy(snapshot.reference, temp / "reference")
        if snapshot.optimizer_state is not None:
            torch.save(snapshot.optimizer_state, temp / "optimizer.pt")
        torch.save(snapshot.torch_rng, temp / "rng.pt")
        python_rng = snapshot.python_rng
        meta = {
            "run_id": self.run_id,
            "step": state.step,
            "policy_version": state.policy_version,
            "counters": state.counters,
            "python_rng": [python_rng[0], list(python_rng[1]), python_rng[2]],
        }
        (temp / "state.json").write_text(json.dumps(meta))
        frames = [
            encode(make_envelope(g, run_id=self.run_id, sender="checkpoint", policy_version=0)) for g in state.buffer
        ]
        (temp / "buffer.msgpack").write_bytes(msgpack.packb(frames, use_bin_type=True))
        _fsync_tree(temp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(temp, target)
        _fsync_tree(self.root)
        for old in self.complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def load(self, path: Path) -> Restored:
        """Read one checkpoint back and restore the RNG states; refuses another run's."""
        meta = json.loads((path / "state.json").read_text())
        if meta["run_id"] != self.run_id:
            raise ConfigError(f"checkpoint {path} belongs to run {meta['run_id']!r}, not {self.run_id!r}")
        reference = load_policy(path / "reference") if (path / "reference").is_dir() else None
        sharded = is_sharded(path)
        optimizer_state = None if sharded else torch.load(path / "optimizer.pt", weights_only=True)
        torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True))
        version, internal, gauss = meta["python_rng"]
        random.setstate((version, tuple(internal), gauss))
        frames = msgpack.unpackb((path / "buffer.msgpack").read_bytes(), raw=False)
        buffer = [decode(frame, MAX_GROUP_BYTES).payload for frame in frames]
        state = TrainerState(
            step=int(meta["step"]),
            policy_version=int(meta["policy_version"]),
            counters=dict(meta["counters"]),
            buffer=buffer,
        )
        return Restored(path, self.policy_of(path), reference, optimizer_state, state)

    def policy_of(self, path: Path) -> Policy:
        """A checkpoint's model and tokenizer; a sharded one's with fresh weights (the shards
        are loaded into it once it is sharded, or by `load_weights`)."""
        if is_sharded(path):
            policy = architecture_of(path / "model")
            if (path / "model" / ADAPTER_CONFIG).exists():
                policy = load_adapters(policy, path / "model")
            return policy
        if (path / "adapter").is_dir():
            return load_adapters(load_policy(self.base), path / "adapter")
        return load_policy(path / "model")

    @property
    def base(self) -> Path:
        """The frozen base of a run with LoRA adapters (replicas)."""
        return self.root / "base"

    def save_base(self, policy: Policy) -> None:
        """Write the base once (before adapters are put on it), complete or not at all."""
        if self.base.is_dir():
            return
        temp = self.base.with_suffix(TMP)
        shutil.rmtree(temp, ignore_errors=True)
        save_policy(policy, temp)
        _fsync_tree(temp)
        os.replace(temp, self.base)
