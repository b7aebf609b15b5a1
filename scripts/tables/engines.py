"""docs/engines.md's figures from `llamarl bench engines`: each engine's tokens/s and start, and
what taking up a version costs vLLM."""

from __future__ import annotations

from tables.figures import load, rounded, spread

ENGINES = {
    "native-float32": "native float32",
    "native-bfloat16": "native bfloat16",
    "vllm-float32": "vLLM float32",
    "vllm-bfloat16": "**vLLM bfloat16**",
}


def engines() -> list[str]:
    """Tokens/s of each engine and dtype on SmolLM2-135M, and vLLM's take-up of a version."""
    result = load("engines_smollm2.json")
    summary = result["summary"]
    lines = [
        "| engine | tokens/s, 32 x 16 | tokens/s, 32 x 128 | against native float32, 32 x 128 | start |",
        "|---|---|---|---|---|",
    ]
    for key, label in ENGINES.items():
        arm = summary[key]
        against = spread(arm["over_native_float32"]["32x128"]) if "over_native_float32" in arm else "1"
        start = f"{rounded(arm['start_s']['median'], 1)} s"
        if "engine_start_s" in arm:
            start += f" (engine {rounded(arm['engine_start_s']['median'], 1)} s)"
        tokens = " | ".join(spread(arm[shape], 0, "") for shape in ("32x16", "32x128"))
        lines.append(f"| {label} | {tokens} | {against} | {start} |")
    take_up = [
        f"{spread(summary[key]['take_up_s'], 3, ' s')} in {dtype}, "
        f"{spread(summary[key]['take_up_over_memcpy'], 1)} a memcpy of its bytes in the same process"
        for key, dtype in (("vllm-bfloat16", "bfloat16"), ("vllm-float32", "float32"))
    ]
    return [*lines, "", f"Taking up a version of the model costs vLLM {take_up[0]}; {take_up[1]}."]
