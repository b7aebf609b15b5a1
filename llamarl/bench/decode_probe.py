"""A generation batch timed as a generator runs it: a process of its own on `threads` cores,
the config's model and prompts, every completion max_new_tokens long. `llamarl bench profile`
fits its decode costs to these, so the simulator charges a generator what a generator pays (a
sync run, whose process also holds the trainer, decodes measurably slower; the profile keeps
that apart)."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from typing import Any

REPEATS = 5
"""Timed batches after one warm-up batch; the median is kept."""


def _time_batches(tree: dict[str, Any], threads: int, prompts: int, out: Any) -> None:
    import torch

    from llamarl.config import parse_config
    from llamarl.engine.adapters import with_adapters
    from llamarl.engine.model import make_policy
    from llamarl.engine.sampling import sample
    from llamarl.launch.cores import encoded_prompts

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    torch.set_num_threads(threads)
    config = parse_config(tree)
    gen = config.generation
    policy = with_adapters(make_policy(config.model, config.seed), config.model.lora, config.seed)
    encoded = encoded_prompts(config, policy, prompts)
    rng = torch.Generator().manual_seed(config.seed)

    def batch() -> None:
        sample(
            policy,
            encoded,
            num_samples=gen.num_samples,
            max_new_tokens=gen.max_new_tokens,
            min_new_tokens=gen.max_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=rng,
        )

    batch()
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        batch()
        times.append(time.perf_counter() - started)
    out.put(statistics.median(times))


def batch_seconds(tree: dict[str, Any], threads: int, prompts: int) -> float:
    """Median seconds of one batch of `prompts` prompts (x num_samples sequences)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_time_batches, args=(tree, threads, prompts, out))
    proc.start()
    try:
        seconds: float = out.get(timeout=900)
    finally:
        proc.join(60)
    return seconds
