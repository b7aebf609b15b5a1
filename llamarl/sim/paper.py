"""`llamarl sim --paper`: LlamaRL's three scale points (Llama 3.1 8B, 70B and 405B on H100s)
through the same simulator, from public figures and assumptions of ours, next to the step times
and speed-ups the LlamaRL paper reports.

Public figures: model sizes and shapes (Llama 3.1 model cards), H100 SXM memory, bandwidth and
bf16 throughput (NVIDIA's datasheet), and three transfer times the LlamaRL paper measured (its
DDMA weight sync: about 2 s at 405B and 1.15 s at 70B; OpenRLHF's gather-and-broadcast path:
111.65 s at 70B). Everything else is an assumption of ours, listed in ASSUMED and in docs/simulator.md:
the paper does not publish its GPU counts, batch sizes or lengths per scale.

The model of each step. Training: 6 x parameters x tokens at MFU of the GPUs training.
Generation: memory-bound decoding, each position reading the weights and the batch's KV cache
at a fraction of HBM bandwidth, in as many rounds as the KV cache the memory leaves can hold.
Sync (the DeepSpeed-Chat-like baseline): every GPU generates, then trains, with the training
state (16 bytes a parameter, sharded over all GPUs) and bf16 weights resident, and then hands
the weights to generation through one rank at the rate of OpenRLHF's path. Async (LlamaRL): half
the GPUs train, half generate from fp8 weights with no training state, one version of lag, and
each version moves by DDMA (both ends busy for its duration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llamarl.sim.costs import Costs, Lengths, ThreadCosts
from llamarl.sim.rl import Layout, simulate_async, simulate_sync, speedup


@dataclass(frozen=True)
class Model:
    params: float
    layers: int
    kv_heads: int = 8
    head_dim: int = 128

    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


MODELS = {"8B": Model(8.03e9, 32), "70B": Model(70.6e9, 80), "405B": Model(405.9e9, 126)}
"""Llama 3.1 model cards: parameters, layers; grouped-query attention of 8 KV heads of 128."""

H100_MEMORY, H100_HBM, H100_BF16 = 80e9, 3.35e12, 989e12
"""NVIDIA H100 SXM: bytes of HBM3, its bytes per second, dense bf16 FLOP/s."""

DDMA_S = {"8B": 2.0 * 8.03 / 405.9, "70B": 1.15, "405B": 2.0}
"""LlamaRL's measured DDMA weight sync (70B, 405B); 8B scaled from 405B by size (ours)."""

GATHER_BYTES_PER_S = 2 * 70.6e9 / 111.65
"""OpenRLHF's weight path as the LlamaRL paper measured it at 70B: bf16 weights in 111.65 s."""

PAPER: dict[str, dict[str, float]] = {
    "8B": {"async_s": 8.90, "speedup": 2.52},
    "70B": {"async_s": 20.67, "speedup": 3.98},
    "405B": {"sync_s": 635.8, "async_s": 59.5, "speedup": 10.7},
}
"""LlamaRL's reported step seconds and speed-up over its baseline: the abstract states 10.7x
and 635.8 s -> 59.5 s at 405B; 8B and 70B come from the paper's table via secondary sources,
their sync seconds as async x speed-up."""

ASSUMED: dict[str, Any] = {
    "gpus": {"8B": 64, "70B": 256, "405B": 1024},
    "sync_tensor_parallel": {"8B": 1, "70B": 8, "405B": 16},
    "async_tensor_parallel": {"8B": 1, "70B": 4, "405B": 8},
    "prompts_per_step": 512,
    "samples_per_prompt": 4,
    "prompt_tokens": 512,
    "completion_tokens": 1024,
    "training_mfu": 0.4,
    "decode_bandwidth_fraction": 0.6,
    "sync_reserved_bytes_per_gpu": 20e9,
    "training_state_bytes_per_param": 16,
    "sync_weight_bytes_per_param": 2,
    "async_weight_bytes_per_param": 1,
}
"""Ours, not the paper's: GPUs per scale, parallelism, batch and lengths, efficiencies, and the
memory the training engine keeps (activations, buffers) while the baseline generates."""


def generate_s(
    model: Model, gpus: int, tensor_parallel: int, weight_bytes: float, resident_bytes_per_gpu: float
) -> float:
    """Seconds to decode a step's sequences on `gpus` in instances of `tensor_parallel` GPUs,
    the KV cache getting what the weights and `resident_bytes_per_gpu` leave."""
    a = ASSUMED
    sequences = a["prompts_per_step"] * a["samples_per_prompt"]
    per_token = model.kv_bytes_per_token()
    full = per_token * (a["prompt_tokens"] + a["completion_tokens"])  # a sequence at its end
    mean = per_token * (a["prompt_tokens"] + a["completion_tokens"] / 2)  # read per position
    free = tensor_parallel * (H100_MEMORY - resident_bytes_per_gpu) - model.params * weight_bytes
    if free < full:
        raise ValueError(f"{model.params:.3g} parameters leave no KV cache at this layout")
    per_instance = math.ceil(sequences / (gpus // tensor_parallel))
    batch = min(int(free // full), per_instance)
    rounds = math.ceil(per_instance / batch)
    bandwidth = tensor_parallel * H100_HBM * a["decode_bandwidth_fraction"]
    return rounds * a["completion_tokens"] * (model.params * weight_bytes + batch * mean) / bandwidth


def costs_at(scale: str) -> Costs:
    """The scale's costs as a two-"core" profile: 1 = half the GPUs (an async role), 2 = all
    of them (the sync baseline doing both)."""
    a, model, gpus = ASSUMED, MODELS[scale], ASSUMED["gpus"][scale]

    def train_s_per_token(training_gpus: int) -> float:
        return 6 * model.params / (training_gpus * H100_BF16 * a["training_mfu"])

    state = a["training_state_bytes_per_param"] * model.params / gpus
    colocated = generate_s(
        model,
        gpus,
        a["sync_tensor_parallel"][scale],
        a["sync_weight_bytes_per_param"],
        state + a["sync_reserved_bytes_per_gpu"],
    )
    dedicated = generate_s(model, gpus // 2, a["async_tensor_parallel"][scale], a["async_weight_bytes_per_param"], 0.0)
    positions = a["completion_tokens"]
    return Costs(
        threads={
            1: ThreadCosts(dedicated / positions, 0.0, 0.0, train_s_per_token(gpus // 2)),
            2: ThreadCosts(colocated / positions, 0.0, 0.0, train_s_per_token(gpus)),
        },
        score_s_per_group=0.0,
        stage_s=DDMA_S[scale],
        pull_s=DDMA_S[scale],
        prompt_tokens=a["prompt_tokens"],
        corun_slowdown={},
        cores=2,
        handover_s=a["sync_weight_bytes_per_param"] * model.params / GATHER_BYTES_PER_S,
    )


def paper(steps: int) -> dict[str, Any]:
    """Predicted sync and async step seconds and speed-up per scale, beside the paper's."""
    a = ASSUMED
    layout = Layout(
        cores=2,
        num_generators=1,
        generator_threads=1,
        trainer_threads=1,
        num_reward=1,
        max_staleness=1,
        prompts_per_step=a["prompts_per_step"],
        prompts_per_batch=a["prompts_per_step"],
        num_samples=a["samples_per_prompt"],
    )
    lengths = Lengths(a["completion_tokens"], a["completion_tokens"])
    rows = []
    for scale in MODELS:
        costs = costs_at(scale)
        sync = simulate_sync(layout, costs, lengths, steps)
        asynchronous = simulate_async(layout, costs, lengths, steps)
        reported = PAPER[scale]
        rows.append(
            {
                "model": scale,
                "gpus": a["gpus"][scale],
                "sync_s_per_step": round(sync.s_per_step, 2),
                "async_s_per_step": round(asynchronous.s_per_step, 2),
                "speedup": round(speedup(sync, asynchronous), 2),
                "paper_sync_s_per_step": reported.get("sync_s", round(reported["async_s"] * reported["speedup"], 2)),
                "paper_async_s_per_step": reported["async_s"],
                "paper_speedup": reported["speedup"],
                "sync_phases_s": {
                    phase: round((1 - idle) * sync.s_per_step, 2) for phase, idle in sync.idle_fraction.items()
                },
            }
        )
    return {"assumed": ASSUMED, "scales": rows}
