"""`llamarl bench engines`: a generator's tokens per second with the native engine (float32,
bfloat16) against vLLM (float32, bfloat16), in interleaved rounds, on the same model, prompts and
shapes (SmolLM2-135M-Instruct by default; 4 prompts x 8 samples, 16 and 128 tokens each). Each
arm runs in a fresh process (`llamarl.bench.engine_arm`), so a round is every arm once, in turn,
and each arm's engine start is measured too; vLLM arms also time taking up one version against a
memcpy of its bytes, measured in the same process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from llamarl.bench.engine_arm import PROMPTS, SAMPLES, SHAPES
from llamarl.bench.stats import spread

ARMS = (("native", "float32"), ("native", "bfloat16"), ("vllm", "float32"), ("vllm", "bfloat16"))
BASELINE = "native-float32"


def _arm(engine: str, dtype: str, model_dir: str, threads: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "llamarl.bench.engine_arm", engine, dtype, model_dir, str(threads)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{engine} {dtype} arm failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench(model_dir: str, rounds: int, threads: int, arms: list[str]) -> dict[str, Any]:
    chosen = [(e, d) for e, d in ARMS if f"{e}-{d}" in arms]
    runs: dict[str, list[dict[str, Any]]] = {f"{e}-{d}": [] for e, d in chosen}
    for _ in range(rounds):
        for engine, dtype in chosen:
            runs[f"{engine}-{dtype}"].append(_arm(engine, dtype, model_dir, threads))
    shapes = [f"{PROMPTS * SAMPLES}x{tokens}" for tokens in SHAPES]
    summary: dict[str, Any] = {}
    for name, rows in runs.items():
        summary[name] = {
            "start_s": spread([r["start_s"] for r in rows], 2),
            **{shape: spread([r[shape]["tokens_per_s"] for r in rows], 1) for shape in shapes},
        }
        if name.startswith("vllm"):
            take_up = [r["take_up_s"] / r["memcpy_s"] for r in rows]
            summary[name] |= {
                "engine_start_s": spread([r["engine_start_s"] for r in rows], 2),
                "take_up_s": spread([r["take_up_s"] for r in rows], 3),
                "memcpy_s": spread([r["memcpy_s"] for r in rows], 4),
                "take_up_over_memcpy": spread(take_up, 1),
            }
        if name != BASELINE and BASELINE in runs:
            summary[name]["over_native_float32"] = {
                shape: spread(
                    [
                        a[shape]["tokens_per_s"] / b[shape]["tokens_per_s"]
                        for a, b in zip(rows, runs[BASELINE], strict=True)
                    ],
                    2,
                )
                for shape in shapes
            }
    return {
        "bench": "engines",
        "model": model_dir,
        "threads": threads,
        "rounds": rounds,
        "shapes": {
            s: {"prompts": PROMPTS, "samples": SAMPLES, "tokens": t} for s, t in zip(shapes, SHAPES, strict=True)
        },
        "summary": summary,
        "runs": runs,
    }
