"""`llamarl bench memory`: each trainer rank's measured peak memory beside the estimate that
`llamarl.training.memory` makes before a run starts.

Models are Llama-shaped (LlamaConfig, random weights, vocabulary 32000, grouped-query attention,
tied embeddings) at about 0.1B, 0.5B, 0.7B and 1B parameters; `SIZES` holds their shapes and the
output their parameter counts. Each is run as: ddp x 2 ranks, fsdp x 2, fsdp x 2 reducing the
gradients in every micro-batch (fsdp-rs), fsdp x 2 with activation checkpointing, and LoRA (r=16,
the config's default target layers) on one rank, all float32 on CPU. A row is a fresh set of
spawned processes (two ranks join a gloo group on a free port) that set glibc lean as a
trainer near the host's memory does (`allocator.return_freed_memory`), build the model, wrap
it as the trainer does (`Learner`) and take `--steps` real steps on synthetic groups (2
completions of 24 tokens after an 8-token prompt) sized so that each rank cuts the size's number
of micro-batches of its micro_batch_tokens. Each rank reports its peak RSS (`ru_maxrss`, also
after building, wrapping and each step) and its seconds per step (the median of the steps after
the first). The estimate is `memory.estimate_rank` given this workload (the tokens a micro-batch
computes, and its completions). A row whose ranks the memory check refuses on this host (a
RunConfig whose model.path holds the size's config.json; trainer ranks only) is reported as
refused with the check's line, and not run; a row that the memory free right now could not hold
is skipped, so the bench never pushes the host into its OOM killer.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llamarl.config import AlgorithmConfig, LoraConfig, TrainerConfig, parse_config
from llamarl.engine.grouped import TrainGroup
from llamarl.engine.model import Policy
from llamarl.engine.tokenizer import build_char_tokenizer
from llamarl.errors import ConfigError
from llamarl.launch.allocator import return_freed_memory
from llamarl.launch.cores import usable_cores
from llamarl.net import free_port_block
from llamarl.training import memory, memory_check
from llamarl.training.learner import Learner
from llamarl.training.parallel import TrainerRanks

GiB = memory.GiB
NUM_SAMPLES = 2
PROMPT_TOKENS = 8
COMPLETION_TOKENS = 24
GROUP_TOKENS = NUM_SAMPLES * (PROMPT_TOKENS + COMPLETION_TOKENS)
TIMEOUT_S = 1800.0
HEADROOM = 1.1
"""A row runs only when the memory free now holds its estimate with this margin."""


@dataclass(frozen=True)
class Size:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    micro_batch_tokens: int
    micro_batches: int
    """Micro-batches each rank cuts a step into (more than one: gradients accumulate)."""
    vocab_size: int = 32000


SIZES = {
    "0.1b": Size(768, 12, 12, 12, 2048, micro_batch_tokens=256, micro_batches=2),
    "0.5b": Size(1536, 16, 24, 8, 4096, micro_batch_tokens=64, micro_batches=2),
    "0.7b": Size(2048, 10, 32, 8, 8192, micro_batch_tokens=64, micro_batches=1),
    "1b": Size(2048, 16, 32, 8, 8192, micro_batch_tokens=64, micro_batches=1),
}
"""Llama 3.2-like shapes (hidden, layers, heads, grouped key-value heads, MLP width) with Llama
2's vocabulary; 0.7b is 1b with 10 layers, sized to sit between what ddp x 2 and fsdp x 2 can
hold on a 24 GiB host. Micro-batches are small so that a step takes seconds to a minute on two
cores; the larger two take one a rank (fsdp's steps take half as long)."""


CONFIGS: dict[str, tuple[int, dict[str, Any], bool]] = {
    "ddp": (2, {"sharding": "ddp"}, False),
    "fsdp": (2, {"sharding": "fsdp"}, False),
    "fsdp-rs": (2, {"sharding": "fsdp", "reduce_gradients": "micro_batch"}, False),
    "fsdp-ac": (2, {"sharding": "fsdp", "activation_checkpointing": True}, False),
    "lora": (1, {}, True),
}
"""Name: (ranks, trainer fields, LoRA)."""


def llama_config(size: Size) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        intermediate_size=size.intermediate_size,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def trainer_config(size: Size, config: str) -> TrainerConfig:
    ranks, fields, _ = CONFIGS[config]
    return TrainerConfig(lr=1e-5, ranks=ranks, micro_batch_tokens=size.micro_batch_tokens, sft_steps=0, **fields)


def synthetic_groups(count: int, vocab_size: int, seed: int) -> list[TrainGroup]:
    generator = torch.Generator().manual_seed(seed)
    shape = (NUM_SAMPLES, COMPLETION_TOKENS)
    return [
        TrainGroup(
            prompt_ids=torch.randint(3, vocab_size, (PROMPT_TOKENS,), generator=generator),
            completion_ids=torch.randint(3, vocab_size, shape, generator=generator),
            completion_mask=torch.ones(shape, dtype=torch.long),
            behaviour_logprobs=-torch.rand(shape, generator=generator) * 5,
            rewards=torch.rand(NUM_SAMPLES, generator=generator),
        )
        for _ in range(count)
    ]


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rank(rank: int, world: int, port: int, size_name: str, config: str, steps: int, out: Any) -> None:
    """One trainer rank: build, wrap, train `steps` steps; report its peaks and step times."""
    os.environ |= {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.set_num_threads(max(1, usable_cores() // world))
    return_freed_memory()  # as a trainer near the host's memory does
    ranks = TrainerRanks.from_env("cpu", TIMEOUT_S, "bench-memory")
    size = SIZES[size_name]
    baseline = _peak()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # every rank the same weights, as fsdp needs
        policy = Policy(LlamaForCausalLM(llama_config(size)).eval(), build_char_tokenizer())
    built = _peak()
    if CONFIGS[config][2]:
        from llamarl.engine.adapters import with_adapters

        policy = with_adapters(policy, LoraConfig(r=16))
    learner = Learner(policy, AlgorithmConfig(), trainer_config(size, config), 1.0, ranks=ranks)
    peaks = {"baseline": baseline, "built": built, "wrapped": _peak()}
    per_step = world * size.micro_batches * (size.micro_batch_tokens // GROUP_TOKENS)
    seconds = []
    for step in range(steps):
        groups = synthetic_groups(per_step, size.vocab_size, seed=step)
        started = time.perf_counter()
        learner.step(groups)
        seconds.append(time.perf_counter() - started)
        peaks[f"step {step + 1}"] = _peak()
    out.put({"rank": rank, "peak_bytes": _peak(), "peaks": peaks, "step_s": seconds})
    if ranks is not None:
        ranks.close()


def measure(size_name: str, config: str, steps: int) -> list[dict[str, Any]] | str:
    """Each rank's report from a fresh set of processes, or what went wrong."""
    world = CONFIGS[config][0]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port_block(size=1)
    args = (world, port, size_name, config, steps, out)
    procs = [ctx.Process(target=_rank, args=(rank, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(reports) < world and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            try:
                reports.append(out.get(timeout=1.0))
            except queue.Empty:  # keep watching the ranks
                continue
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if len(reports) < world:
        return f"a rank failed (exit codes {[p.exitcode for p in procs]})"
    return sorted(reports, key=lambda report: report["rank"])


def shape_of(size: Size, lora: bool) -> memory.ModelShape:
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(size))
    return memory.shape_of(model, LoraConfig(r=16) if lora else None)


def refusal(size_name: str, config: str, directory: Path) -> str | None:
    """The memory check's line for this row on this host (trainer ranks only), or None."""
    size = SIZES[size_name]
    model_dir = directory / size_name
    if not (model_dir / "config.json").exists():
        llama_config(size).save_pretrained(model_dir)
    world, fields, lora = CONFIGS[config]
    run = parse_config(
        {
            "model": {"path": str(model_dir), "lora": {"r": 16} if lora else None},
            "trainer": {"ranks": world, "micro_batch_tokens": size.micro_batch_tokens, "sft_steps": 0, **fields},
            "generation": {"num_samples": NUM_SAMPLES, "max_new_tokens": COMPLETION_TOKENS},
        }
    )
    try:
        memory_check.check_memory(run, generators=False)
    except ConfigError as err:
        return str(err)
    return None


def available_bytes() -> int:
    """Memory the kernel could give now (MemAvailable)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return memory_check.host_memory()[0]


def _gib(num_bytes: float) -> float:
    return round(num_bytes / GiB, 2)


def row(size_name: str, config: str, steps: int, directory: Path) -> dict[str, Any]:
    """One row: the estimate, then the check's refusal, a skip, or the measurement."""
    size = SIZES[size_name]
    world, _, lora = CONFIGS[config]
    groups = size.micro_batch_tokens // GROUP_TOKENS
    completions = groups * NUM_SAMPLES * COMPLETION_TOKENS
    work = memory.Workload(groups * PROMPT_TOKENS, completions, NUM_SAMPLES, size.micro_batches)
    estimate = memory.estimate_rank(shape_of(size, lora), trainer_config(size, config), work)
    entry: dict[str, Any] = {
        "size": size_name,
        "config": config,
        "ranks": world,
        "estimate_gib": _gib(estimate.total),
        "estimate_phase": estimate.phase,
        "estimate_terms_gib": {name: _gib(value) for name, value in estimate.terms.items()},
    }
    refused = refusal(size_name, config, directory)
    if refused is not None:
        return entry | {"refused": refused}
    free = available_bytes()
    if world * estimate.total * HEADROOM > free:
        return entry | {
            "skipped": f"{_gib(free)} GiB free now, the estimate needs "
            f"{_gib(world * estimate.total * HEADROOM)} with margin"
        }
    reports = measure(size_name, config, steps)
    if isinstance(reports, str):
        return entry | {"failed": reports}
    peak = max(report["peak_bytes"] for report in reports)
    timed = reports[0]["step_s"][1:] or reports[0]["step_s"]
    return entry | {
        "peak_gib": [_gib(report["peak_bytes"]) for report in reports],
        "ratio": round(estimate.total / peak, 3),
        "s_per_step": round(statistics.median(timed), 2),
        "step_s": [round(s, 2) for s in reports[0]["step_s"]],
        "peak_gib_after": {name: _gib(value) for name, value in reports[0]["peaks"].items()},
    }


def bench(sizes: list[str], configs: list[str], steps: int) -> dict[str, Any]:
    for name in sizes:
        if name not in SIZES:
            raise ConfigError(f"--sizes: {name} is not one of {', '.join(SIZES)}")
    for name in configs:
        if name not in CONFIGS:
            raise ConfigError(f"--configs: {name} is not one of {', '.join(CONFIGS)}")
    limit, _ = memory_check.host_memory()
    shapes = {
        name: asdict(SIZES[name])
        | {
            "num_params": shape_of(SIZES[name], False).num_params,
            "num_lora_params": shape_of(SIZES[name], True).num_trained,
        }
        for name in sizes
    }
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for size_name in sizes:
            for config in configs:
                rows.append(row(size_name, config, steps, Path(directory)))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {
        "host_memory_gib": _gib(limit),
        "cores": usable_cores(),
        "steps": steps,
        "workload": {
            "num_samples": NUM_SAMPLES,
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "dtype": "float32",
            "lora": "r=16, " + ",".join(LoraConfig().target_modules),
        },
        "sizes": shapes,
        "rows": rows,
    }
