"""One arm of `llamarl bench engines`, in a process of its own (a fresh engine each time, its
threads its own): `python -m llamarl.bench.engine_arm ENGINE DTYPE MODEL_DIR THREADS` prints one
JSON line.

It starts the engine (timed), then for each shape decodes once untimed (warm-up) and once timed:
4 prompts x 8 samples (a group of 8 sharing one prompt, 32 rows), every completion exactly
`tokens` long (EOS banned until then), so both engines write the same number of tokens. A vLLM
arm also times taking up a version of the model's weights (`VllmEngine.load`, from the float32
staging model as a generator does) against a memcpy of the same bytes, each 3 times.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

from llamarl.engine.model import Policy, load_policy, place
from llamarl.engine.sampling import sample
from llamarl.engine.vllm_engine import VllmEngine

PROMPTS = 4
SAMPLES = 8
SHAPES = (16, 128)
"""Tokens each completion writes, one timed decode each."""


def prompts(policy: Policy) -> list[list[int]]:
    questions = [f"What is {a} plus {b}? Show your steps." for a, b in [(17, 25), (3, 98), (46, 46), (71, 9)]]
    return [policy.encode_prompt(q) for q in questions[:PROMPTS]]


def memcpy_s(policy: Policy) -> float:
    """Median seconds of 3 copies of the model's float32 weight bytes, buffers already touched."""
    source = torch.cat([p.detach().flatten().float() for p in policy.model.parameters()])
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run_arm(engine_name: str, dtype: str, model_dir: str, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    started = time.perf_counter()
    policy = load_policy(model_dir)
    policy.chat = True
    engine = None
    if engine_name == "vllm":
        from llamarl.config import VllmConfig

        options = VllmConfig.model_validate({"dtype": dtype})
        engine = VllmEngine.start(model_dir, options, "cpu", policy.eos_id, seed=0)
        decode = engine.sample
    else:
        place(policy, "cpu", dtype)
        decode = sample
    result: dict[str, Any] = {
        "engine": engine_name,
        "dtype": dtype,
        "threads": threads,
        "start_s": round(time.perf_counter() - started, 2),
    }
    encoded = prompts(policy)
    for tokens in SHAPES:
        for _warm_then_timed in range(2):
            generator = torch.Generator().manual_seed(0)
            began = time.perf_counter()
            batch = decode(
                policy,
                encoded,
                num_samples=SAMPLES,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                generator=generator,
            )
            seconds = time.perf_counter() - began
        written = int(batch.completion_mask.sum())
        result[f"{PROMPTS * SAMPLES}x{tokens}"] = {
            "tokens": written,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(written / seconds, 1),
        }
    if engine is not None:
        result["engine_start_s"] = round(engine.start_s, 2)
        loads = []
        for _ in range(3):
            began = time.perf_counter()
            engine.load(policy.model)
            loads.append(time.perf_counter() - began)
        result["take_up_s"] = round(statistics.median(loads), 4)
        result["memcpy_s"] = round(memcpy_s(policy), 4)
        result["weight_bytes"] = sum(p.numel() * 4 for p in policy.model.parameters())
    return result


if __name__ == "__main__":
    engine_name, dtype, model_dir, threads = sys.argv[1:5]
    print(json.dumps(run_arm(engine_name, dtype, model_dir, int(threads))), flush=True)
