"""README's headline table, generated from the benchmark results committed under docs/results
(each the JSON a bench wrote with `--out`), so a figure has one source.

    python scripts/results_tables.py          # rewrite the table in README.md
    python scripts/results_tables.py --check  # exit 1 when README.md's table is not the JSON's

tests/unit/test_results.py runs the check.
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
BEGIN = "<!-- headline: generated from docs/results by scripts/results_tables.py -->"
END = "<!-- end of the generated headline -->"


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


def headline(results: Path = RESULTS) -> str:
    """The generated table, markers included."""
    lines = [BEGIN, "", "| measured | median (min-max) | command |", "|---|---|---|"]
    for row in ROWS:
        result = json.loads((results / row.source).read_text())
        lines.append(f"| {row.what} | {row.figure(result)} | `{row.command}` |")
    return "\n".join([*lines, "", END])


def replaced(text: str, table: str) -> str:
    """`text` with its generated block replaced by `table`."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + table + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = README.read_text()
    wanted = replaced(text, headline())
    if args.check:
        if wanted != text:
            fix = "run python scripts/results_tables.py"
            print(f"README.md's headline differs from docs/results: {fix}", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
