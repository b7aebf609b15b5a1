"""The tables generated from the benchmark results committed under docs/results (each the JSON a
bench wrote with `--out`), so a figure has one source: README's headline and the tables of docs/
listed in TABLES. Each sits between two markers of its own.

    python scripts/results_tables.py          # rewrite the tables
    python scripts/results_tables.py --check  # exit 1 when a page's table is not its JSON's

tests/unit/test_front_page.py runs the check.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
README = REPO / "README.md"
BEGIN = "<!-- {name}: generated from docs/results by scripts/results_tables.py -->"
END = "<!-- end of the generated {name} -->"


def rounded(value: float, digits: int = 2) -> str:
    """`value` to `digits` decimals, halves up as a person rounds (1.255 -> 1.26)."""
    step = Decimal(1).scaleb(-digits)
    return str(Decimal(str(value)).quantize(step, rounding=ROUND_HALF_UP))


def spread(figure: dict[str, float], digits: int = 2, unit: str = "x") -> str:
    """A median with its min-max, as the docs write them."""
    median, low, high = (rounded(figure[key], digits) for key in ("median", "min", "max"))
    return f"{median}{unit} ({low}-{high})"


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


def headline(results: Path = RESULTS) -> list[str]:
    """README's table: one row per headline figure."""
    lines = ["| measured | median (min-max) | command |", "|---|---|---|"]
    for row in ROWS:
        result = json.loads((results / row.source).read_text())
        lines.append(f"| {row.what} | {row.figure(result)} | `{row.command}` |")
    return lines


def _pulls(result: dict[str, Any], ranks: int, generators: int) -> dict[str, Any]:
    return result["gloo"][f"ranks_{ranks}"][f"generators_{generators}"]


def weight_sync_across_hosts(results: Path = RESULTS) -> list[str]:
    """docs/scaling-out.md's table: gloo pulls across a link against a raw send on it."""
    lines = [
        "| weights | raw gloo send | gloo, 1 rank, 1 generator | ratio | gloo, 2 ranks, 1 generator | ratio "
        "| 2 generators (1 rank / 2 ranks) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in json.loads((results / "weight_sync_across_hosts.json").read_text())["sizes"]:
        ratio = size["gloo_vs_raw_gloo"]
        two = [_pulls(size, ranks, 2)["pull_s"]["median"] for ranks in (1, 2)]
        two_ms = " / ".join(f"{seconds * 1000:.3g}" for seconds in two)
        lines.append(
            f"| {size['mb']:.0f} MB | {spread(size['raw_gloo_GBps'], unit=' GB/s')} "
            f"| {spread(_pulls(size, 1, 1)['pull_GBps'], unit=' GB/s')} | {rounded(ratio['ranks_1'])} "
            f"| {spread(_pulls(size, 2, 1)['pull_GBps'], unit=' GB/s')} | {rounded(ratio['ranks_2'])} "
            f"| {two_ms} ms |"
        )
    return lines


def _per_pair(result: dict[str, Any], mode: str, key: str) -> dict[str, float]:
    values = sorted(pair[mode][key] for pair in result["pairs"])
    return {"median": values[len(values) // 2], "min": values[0], "max": values[-1]}


def _solo(result: dict[str, Any], role: str) -> str:
    values = sorted(pair["solo"][role] for pair in result["pairs"])
    return spread({"median": values[len(values) // 2], "min": values[0], "max": values[-1]}, 3, "")


def async_vs_sync_demo(results: Path = RESULTS) -> list[str]:
    """docs/benchmarks.md's table of the demo's async-vs-sync bench, and its speed-ups."""
    result = json.loads((results / "async_vs_sync_demo.json").read_text())

    def both(key: str) -> str:
        return " | ".join(spread(_per_pair(result, mode, key), 3, "") for mode in ("sync", "async"))

    def accuracy(mode: str) -> str:
        pairs = result["pairs"]
        return ", ".join(f"{p[mode]['initial_accuracy']:.3f} -> {p[mode]['final_accuracy']:.3f}" for p in pairs)

    return [
        "| | sync | async |",
        "|---|---|---|",
        f"| run s/step (evaluations included) | {both('run_s_per_step')} |",
        f"| RL s/step (steps no evaluation slowed) | {both('s_per_step')} |",
        f"| evaluation wall s/step | {both('eval_s_per_step')} |",
        f"| alone at 1 thread, s/step (for the bound) | generate {_solo(result, 'generate')}, train "
        f"{_solo(result, 'train')} | |",
        f"| held-out accuracy, seeds {', '.join(str(p['seed']) for p in result['pairs'])} "
        f"| {accuracy('sync')} | {accuracy('async')} |",
        "",
        f"Speed-up **{spread(result['speedup'])}**, run wall time per step; RL steps alone "
        f"{spread(result['rl_speedup'])}, bound {rounded(result['rl_bound'])}, efficiency "
        f"{rounded(result['rl_efficiency'])}; equal work: {'yes' if result['equal_work'] else 'no'}.",
    ]


def calculator_demos(results: Path = RESULTS) -> list[str]:
    """docs/environments.md's table: the calculator environment against the calculator agent."""
    runs = {
        name: json.loads((results / f"async_vs_sync_{source}.json").read_text())
        for name, source in (("environment", "calculator"), ("agent", "calculator_agent"))
    }
    env = runs["environment"]
    warm = ", ".join(f"{pair['sync']['initial_accuracy']:.3f}" for pair in env["pairs"])

    def row(what: str, result: dict[str, Any], key: str, unit: str = "") -> str:
        cells = " | ".join(spread(_per_pair(result, mode, key), 3, unit) for mode in ("sync", "async"))
        return f"| {what} | {cells} |"

    lines = [
        f"| held-out accuracy (200 pairs), median (min-max) of seeds "
        f"{', '.join(str(p['seed']) for p in env['pairs'])} | sync | async |",
        "|---|---|---|",
        row(f"after warm start, both (the same in every seed: {warm})", env, "initial_accuracy"),
        *(row(f"after RL, the calculator {name}", result, "final_accuracy") for name, result in runs.items()),
        *(
            row(f"run wall time per step, evaluations included: {name}", result, "run_s_per_step", " s")
            for name, result in runs.items()
        ),
        "",
    ]
    for name, result in runs.items():
        lines += [""] if lines[-1] else []
        lines.append(
            f"The {name}: speed-up **{spread(result['speedup'])}** in run wall time per step; RL steps alone "
            f"{spread(result['rl_speedup'])}, bound {rounded(result['rl_bound'])}, efficiency "
            f"{rounded(result['rl_efficiency'])}."
        )
    return lines


ENGINES = {
    "native-float32": "native float32",
    "native-bfloat16": "native bfloat16",
    "vllm-float32": "vLLM float32",
    "vllm-bfloat16": "**vLLM bfloat16**",
}


def engines(results: Path = RESULTS) -> list[str]:
    """docs/engines.md's table: tokens/s of each engine and dtype on SmolLM2-135M."""
    summary = json.loads((results / "engines_smollm2.json").read_text())["summary"]
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
    return lines


TABLES: dict[str, tuple[Path, Callable[[], list[str]]]] = {
    "engines table": (REPO / "docs" / "engines.md", engines),
    "calculator table": (REPO / "docs" / "environments.md", calculator_demos),
    "demo table": (REPO / "docs" / "benchmarks.md", async_vs_sync_demo),
    "headline": (README, headline),
    "weight-sync table": (REPO / "docs" / "scaling-out.md", weight_sync_across_hosts),
}
"""Each generated table: its name in the markers, its page, what makes it."""


def replaced(text: str, name: str, lines: list[str]) -> str:
    """`text` with the block between `name`'s markers replaced by `lines`."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + "\n".join([begin, "", *lines, "", end]) + text[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for name, (page, make) in TABLES.items():
        text = page.read_text()
        wanted = replaced(text, name, make())
        if wanted != text and args.check:
            stale.append(f"{page.relative_to(REPO)} ({name})")
        elif wanted != text:
            page.write_text(wanted)
    if stale:
        print(f"differ from docs/results: {', '.join(stale)}; run python scripts/results_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
