"""`llamarl bench batching CONFIG`: a generator's tokens per second with static batches against
continuous batching, on the config's model and prompts, in interleaved pairs.

Both arms sample the same prompts, `prompts_per_batch` groups at a time, in this process on
`--threads` threads: static decodes each batch until its longest completion ends (what
`generation.batching: static` does); continuous keeps up to `prompts_per_batch` x `num_samples` rows running,
ended rows' places taken by the next prompt's between decode steps (`RunningBatch`, as the
generator's default). A group's place is its rows: a new group joins once as many rows as it
has have ended, in whichever groups. Completions end at EOS, so their lengths vary with the model; the report
gives their median and longest with each arm's tokens, seconds and tokens per second.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from llamarl.bench.stats import spread
from llamarl.config import parse_config
from llamarl.config.run import read_tree
from llamarl.engine.continuous import RunningBatch, Sampler
from llamarl.engine.model import Policy, make_policy
from llamarl.engine.sampling import sample
from llamarl.launch.cores import encoded_prompts


def static_arm(policy: Policy, prompts: list[list[int]], per_batch: int, sampler: Sampler) -> list[int]:
    """Completion lengths, one batch of `per_batch` prompts after another."""
    lengths: list[int] = []
    for start in range(0, len(prompts), per_batch):
        batch = sample(
            policy,
            prompts[start : start + per_batch],
            num_samples=sampler.num_samples,
            max_new_tokens=sampler.max_new_tokens,
            min_new_tokens=sampler.min_new_tokens,
            temperature=sampler.temperature,
            top_p=sampler.top_p,
            generator=sampler.generator,
        )
        lengths += batch.completion_mask.sum(1).tolist()
    return lengths


def continuous_arm(policy: Policy, prompts: list[list[int]], per_batch: int, sampler: Sampler) -> list[int]:
    """Completion lengths, up to `per_batch` groups' rows running at a time."""
    running = RunningBatch(policy, sampler)
    lengths: list[int] = []
    waiting = list(enumerate(prompts))
    while waiting or len(running):
        free = running.free_groups(per_batch)
        running.admit(waiting[:free])
        waiting = waiting[free:]
        for group in running.step(0):
            lengths += group.batch.completion_mask.sum(1).tolist()
    return lengths


ARMS = {"static": static_arm, "continuous": continuous_arm}


def bench(config_path: Path, pairs: int, threads: int, batches: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    config = parse_config(read_tree(config_path))
    gen = config.generation
    policy = make_policy(config.model, config.seed)
    prompts = encoded_prompts(config, policy, gen.prompts_per_batch * batches)
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for pair in range(pairs):
        for arm, run in ARMS.items():
            sampler = Sampler(
                gen.num_samples,
                gen.max_new_tokens,
                gen.min_new_tokens,
                gen.temperature,
                gen.top_p,
                torch.Generator().manual_seed(config.seed + pair),
            )
            started = time.perf_counter()
            lengths = run(policy, prompts, gen.prompts_per_batch, sampler)
            seconds = time.perf_counter() - started
            runs[arm].append(
                {
                    "seconds": round(seconds, 3),
                    "tokens": sum(lengths),
                    "tokens_per_s": round(sum(lengths) / seconds, 1),
                    "median_length": statistics.median(lengths),
                    "longest": max(lengths),
                }
            )
    ratios = [c["tokens_per_s"] / s["tokens_per_s"] for s, c in zip(runs["static"], runs["continuous"], strict=True)]
    return {
        "bench": "batching",
        "config": str(config_path),
        "threads": threads,
        "prompts": len(prompts),
        "prompts_per_batch": gen.prompts_per_batch,
        "num_samples": gen.num_samples,
        "max_new_tokens": gen.max_new_tokens,
        "runs": runs,
        "tokens_per_s": {arm: spread([r["tokens_per_s"] for r in rows], 1) for arm, rows in runs.items()},
        "continuous_over_static": spread(ratios),
    }
