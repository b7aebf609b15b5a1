"""docs/simulator.md's paper mode: `llamarl sim --paper`'s predictions for LlamaRL's three scales
beside the paper's figures."""

from __future__ import annotations

from tables.figures import load, rounded

SLOWER = ("slower", "faster")
"""How a step time above or below the paper's reads."""


def _percent(ratio: float, words: tuple[str, str] = ("above", "below")) -> str:
    return f"{abs(round(100 * (ratio - 1)))}% {words[0] if ratio > 1 else words[1]}"


def scales() -> list[str]:
    """One row per scale, then what the trend and the magnitudes say."""
    result = load("sim_paper.json")["scales"]
    lines = [
        "| model | GPUs (ours) | sync s/step, predicted / paper | async s/step, predicted / paper "
        "| speed-up, predicted / paper |",
        "|---|---|---|---|---|",
    ]
    for scale in result:
        lines.append(
            f"| {scale['model']} | {scale['gpus']} | {rounded(scale['sync_s_per_step'], 1)} / "
            f"{scale['paper_sync_s_per_step']} | {rounded(scale['async_s_per_step'], 1)} / "
            f"{scale['paper_async_s_per_step']} | {scale['speedup']:.3g}x / {scale['paper_speedup']}x |"
        )
    handover = ", ".join(f"{scale['sync_phases_s']['handover']:.3g} s" for scale in result)
    speedups = "; ".join(
        f"{scale['model']} {_percent(scale['speedup'] / scale['paper_speedup'])} the paper's speed-up"
        for scale in result
    )
    async_steps = "; ".join(
        f"{scale['model']} {_percent(scale['async_s_per_step'] / scale['paper_async_s_per_step'], SLOWER)}"
        for scale in result
    )
    return [
        *lines,
        "",
        f"The baseline's weight handover takes {handover} of its step at the three scales; the predicted speed-ups "
        f"are: {speedups}. The predicted async step is {async_steps} than the paper's.",
    ]
