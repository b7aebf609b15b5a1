"""The check that refuses, before anything starts, a run whose trainer would not fit in memory
(`check_memory`, run by `llamarl run`'s preflight and by every trainer process), and the
choice of glibc's setting for a trainer (`trainer_memory`: lean near the host's memory).

The estimate is `llamarl.training.memory`'s, for the micro-batches `run_workload` assumes. On
one host the trainer's ranks must fit together (rank 0, which may warm-start, and N - 1 others)
and, for `llamarl run` (every role on this host), with the generators: each generator's process
baseline plus 4 bytes a parameter (every generator builds or loads the float32 model first,
whatever generation.dtype it casts to), and one staged float32 version (T x 4). Reward workers,
Redis and the broker are not counted. The limit is the host's memory (a cgroup limit when one
is lower), or each GPU's for cuda ranks. When it does not fit, the one-line error offers the
first setting that the estimate says fits: trainer.sharding fsdp, gradients reduced every
micro-batch, activation checkpointing, no warm start, LoRA, a smaller micro-batch (else those
together).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from llamarl.config import LoraConfig, RunConfig
from llamarl.errors import ConfigError
from llamarl.training.memory import (
    GiB,
    ModelShape,
    Shapes,
    Workload,
    estimate_gpu,
    host_rank,
)

GENERATOR_BASELINE_BYTES = 400 << 20
"""A generator process before its model."""
KEEP_BELOW = 0.25
"""A trainer keeps freed memory while its ranks' estimate is under this share of the host's."""


def completion_tokens(config: RunConfig) -> int:
    """The longest completion: a turn's max_new_tokens, or an episode's environment.max_tokens."""
    if config.environment.kind is not None:
        return config.environment.max_tokens
    return config.generation.max_new_tokens


def run_workload(config: RunConfig) -> Workload:
    """What the check assumes of a run's micro-batches. Prompts are taken as long as the longest
    completion (the check cannot see them): a group costs n x 2 x its longest completion of
    micro_batch_tokens and computes its prompt once and its n completions; a micro-batch holds
    as many groups as fit (one at least, a rank's share of a step at most)."""
    gen, trainer = config.generation, config.trainer
    longest = completion_tokens(config)
    per_rank = -(-trainer.prompts_per_step // trainer.ranks)
    cost = gen.num_samples * 2 * longest
    groups = max(1, min(per_rank, trainer.micro_batch_tokens // cost))
    completions = groups * gen.num_samples * longest
    warm_start = trainer.sft_batch_size * 2 * (longest + 1) if trainer.sft_steps else 0
    reference = config.algorithm.kl_coef > 0 and config.model.lora is None
    return Workload(
        prompt_tokens=groups * longest,
        completion_tokens=completions,
        num_samples=gen.num_samples,
        micro_batches=-(-per_rank // groups),
        warm_start_tokens=warm_start,
        reference=reference,
    )


def host_memory(cgroups: Path = Path("/sys/fs/cgroup"), my_cgroup: Path = Path("/proc/self/cgroup")) -> tuple[int, str]:
    """The memory this process's host may use and what limits it: the machine's memory, or a
    lower limit of this process's cgroup or an ancestor's (v2 memory.max, v1 memory controller
    memory.limit_in_bytes)."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    where = "this host has"
    try:
        lines = my_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[Path] = []
    for line in lines:
        _, controllers, where_in = line.split(":", 2)
        if controllers == "":
            base, name = cgroups, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = cgroups / "memory", "memory.limit_in_bytes"
        else:
            continue
        group = base / where_in.strip("/")
        candidates += [d / name for d in (group, *group.parents) if d == base or base in d.parents]
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < limit:
            limit, where = int(text), "its cgroup allows"
    return limit, where


def host_need(config: RunConfig, shape: ModelShape, generators: bool) -> tuple[int, int, int]:
    """(bytes on this host in all, rank 0's, each other rank's) for the trainer's ranks and,
    with `generators`, the generators and one staged version."""
    work = run_workload(config)
    first = host_rank(shape, config.trainer, work, leader=True)
    other = host_rank(shape, config.trainer, work, leader=False)
    total = first + (config.trainer.ranks - 1) * other
    if generators:
        weights = (shape.num_params + shape.num_trained if config.model.lora else shape.num_params) * 4
        total += config.workers.num_generators * (GENERATOR_BASELINE_BYTES + weights)
        total += shape.num_trained * 4
    return total, first, other


def shortfall(config: RunConfig, shapes: Shapes, generators: bool) -> str | None:
    """What does not fit, in words; None when everything does."""
    trainer = config.trainer
    shape = shapes.of(config.model)
    if trainer.device == "cuda" and torch.cuda.is_available():
        gpu = min(
            torch.cuda.get_device_properties(i).total_memory
            for i in range(min(trainer.ranks, torch.cuda.device_count()))
        )
        per_gpu = estimate_gpu(shape, trainer, run_workload(config)).total
        if per_gpu > gpu:
            return (
                f"each of {trainer.ranks} cuda trainer ranks needs about {per_gpu / GiB:.1f} "
                f"GiB of GPU memory and its GPU has {gpu / GiB:.1f} GiB"
            )
    total, first, other = host_need(config, shape, generators)
    limit, where = host_memory()
    if total <= limit:
        return None
    need = f"1 trainer rank needs about {first / GiB:.1f} GiB"
    if trainer.ranks > 1:
        need = f"{trainer.ranks} trainer ranks need about {other / GiB:.1f} GiB each"
        need += f" (rank 0 {first / GiB:.1f} GiB)" if first != other else ""
    with_generators = " with the generators' weights" if generators else ""
    return f"{need}, {total / GiB:.1f} GiB in all{with_generators}, and {where} {limit / GiB:.1f} GiB"


Change = tuple[str, dict[str, dict[str, object]]]
"""A setting offered: its label and the fields it sets, by config section."""


def _changes(config: RunConfig) -> tuple[list[Change], list[Change]]:
    """Settings that lower the estimate, in the order they are offered; and the smaller
    micro-batches (halving, down to one group), largest first."""
    trainer, gen = config.trainer, config.generation
    changes: list[Change] = []
    if trainer.sharding == "ddp" and trainer.ranks > 1:
        changes.append(("trainer.sharding: fsdp", {"trainer": {"sharding": "fsdp"}}))
    if trainer.ranks > 1 and trainer.reduce_gradients == "step":  # lowers fsdp's estimate
        changes.append(("trainer.reduce_gradients: micro_batch", {"trainer": {"reduce_gradients": "micro_batch"}}))
    if not trainer.activation_checkpointing:
        changes.append(("trainer.activation_checkpointing: true", {"trainer": {"activation_checkpointing": True}}))
    if trainer.sft_steps:
        changes.append(("trainer.sft_steps: 0", {"trainer": {"sft_steps": 0}}))
    if config.model.lora is None:
        lora: dict[str, dict[str, object]] = {"model": {"lora": LoraConfig()}}
        if trainer.sft_steps:  # adapters go on the base the generators load: no warm start
            changes.append(("trainer.sft_steps: 0 and model.lora: {r: 16}", lora | {"trainer": {"sft_steps": 0}}))
        else:
            changes.append(("model.lora: {r: 16}", lora))
    smaller: list[Change] = []
    tokens = trainer.micro_batch_tokens // 2
    while tokens >= gen.num_samples * 2 * completion_tokens(config):
        smaller.append((f"trainer.micro_batch_tokens: {tokens}", {"trainer": {"micro_batch_tokens": tokens}}))
        tokens //= 2
    return changes, smaller


def _changed(config: RunConfig, changes: list[Change]) -> RunConfig:
    """The config with `changes` made, in order (a later one wins a field)."""
    updates: dict[str, dict[str, object]] = {}
    for _, sections in changes:
        for section, fields in sections.items():
            updates.setdefault(section, {}).update(fields)
    return config.model_copy(
        update={section: getattr(config, section).model_copy(update=fields) for section, fields in updates.items()}
    )


def fix(config: RunConfig, shapes: Shapes, generators: bool) -> str:
    """The first setting that makes the estimate fit; else the first several that do together,
    less any of them the rest fit without."""

    def fits(chosen: list[Change]) -> bool:
        return shortfall(_changed(config, chosen), shapes, generators) is None

    changes, smaller = _changes(config)
    for change in changes + smaller:
        if fits([change]):
            return f"set {change[0]}"
    chosen: list[Change] = []
    for change in changes + smaller:
        chosen.append(change)
        if fits(chosen):
            for extra in list(chosen):
                if fits([c for c in chosen if c is not extra]):
                    chosen.remove(extra)
            return "set " + ", ".join(label for label, _ in chosen)
    return "no trainer setting makes it fit: use a smaller model or a host with more memory"


def check_memory(config: RunConfig, generators: bool = True, shapes: Shapes | None = None) -> None:
    """ConfigError, one line, when the trainer's ranks (and, with `generators`, the generators'
    weights) would not fit in this host's memory or a cuda rank in its GPU's; it names the
    estimate, the ranks, the limit and the first setting that fits."""
    shapes = Shapes() if shapes is None else shapes
    problem = shortfall(config, shapes, generators)
    if problem is not None:
        raise ConfigError(f"trainer memory: {problem}; {fix(config, shapes, generators)}")


def trainer_memory(config: RunConfig, go_lean: Callable[[], object]) -> RunConfig:
    """A trainer process's memory, set before its model is built: ConfigError when its ranks
    would not fit in this host's memory (generators are not counted: they may run elsewhere);
    `go_lean()`, glibc's lean setting (`llamarl.launch.allocator.return_freed_memory`, handed in
    by the process), when their estimate is over KEEP_BELOW of it (else it keeps freed memory, as
    every llamarl process starts). The config, as it is."""
    shapes = Shapes()
    check_memory(config, generators=False, shapes=shapes)
    total, _, _ = host_need(config, shapes.of(config.model), generators=False)
    if total > KEEP_BELOW * host_memory()[0]:
        go_lean()
    return config
