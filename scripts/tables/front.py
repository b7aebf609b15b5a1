"""README's headline table: one row per figure, each read from one JSON with its command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tables.figures import load, rounded, spread


@dataclass(frozen=True)
class Row:
    """One line of the headline: what is measured, read from one JSON, and its command."""

    what: str
    source: str
    figure: Callable[[dict[str, Any]], str]
    command: str


def _pull_ratio(result: dict[str, Any]) -> str:
    big = result["sizes"][-1]
    return f"{rounded(big['gloo_vs_raw_gloo']['ranks_1'])}x at {big['mb']:.0f} MB, 1 rank"


ROWS = (
    Row(
        "The demo: async against sync, run wall time a step, evaluations included",
        "async_vs_sync_demo.json",
        lambda r: spread(r["speedup"]),
        "llamarl bench async-vs-sync --config configs/tiny.yaml",
    ),
    Row(
        "The same, RL steps only (bound from the roles' solo times)",
        "async_vs_sync_demo.json",
        lambda r: f"{spread(r['rl_speedup'])}; bound {rounded(r['rl_bound'])}x",
        "llamarl bench async-vs-sync --config configs/tiny.yaml",
    ),
    Row(
        "SmolLM2-135M, the own-model example: the default against sync, run wall time a step",
        "async_vs_sync_own_model.json",
        lambda r: spread(r["speedup"]),
        "PYTHONPATH=configs/examples/own_model llamarl bench async-vs-sync "
        "--config configs/examples/own_model/bench_layouts.yaml",
    ),
    Row(
        "Calculator episodes: async against sync, run wall time a step",
        "async_vs_sync_calculator.json",
        lambda r: spread(r["speedup"]),
        "llamarl bench async-vs-sync --config configs/episodes/calculator.yaml --target 0.98",
    ),
    Row(
        "The calculator as an OpenAI-API agent: async against sync",
        "async_vs_sync_calculator_agent.json",
        lambda r: spread(r["speedup"]),
        "llamarl bench async-vs-sync --config configs/episodes/calculator_agent.yaml --target 0.98",
    ),
    Row(
        "vLLM bfloat16 against our float32 sampler, SmolLM2-135M, 32 x 128 tokens",
        "engines_smollm2.json",
        lambda r: spread(r["summary"]["vllm-bfloat16"]["over_native_float32"]["32x128"]),
        "llamarl bench engines",
    ),
    Row(
        "Weight sync between two hosts against a raw gloo send on the same link",
        "weight_sync_across_hosts.json",
        _pull_ratio,
        "llamarl bench weight-sync --across-hosts",
    ),
)


def headline() -> list[str]:
    """README's table: one row per headline figure."""
    lines = ["| measured | median (min-max) | command |", "|---|---|---|"]
    for row in ROWS:
        lines.append(f"| {row.what} | {row.figure(load(row.source))} | `{row.command}` |")
    return lines
