"""The tables generated from the benchmark results committed under docs/results (each the JSON a
bench wrote with `--out`), so a figure has one source: README's headline and the tables of docs/
listed in TABLES. Each sits between two markers of its own.

    python scripts/results_tables.py          # rewrite the tables
    python scripts/results_tables.py --check  # exit 1 when a page's table is not its JSON's

tests/unit/test_front_page.py runs the check, and tests/unit/test_doc_figures.py checks that no
figure on docs/benchmarks.md stands outside a generated block.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tables import async_sync, costs, engines, front, grid, learning, paper, transports
from tables.figures import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
BEGIN = "<!-- {name}: generated from docs/results by scripts/results_tables.py -->"
END = "<!-- end of the generated {name} -->"

TABLES: dict[str, tuple[Path, Callable[[], list[str]]]] = {
    "headline": (README, front.headline),
    "demo table": (DOCS / "benchmarks.md", async_sync.demo),
    "batching table": (DOCS / "benchmarks.md", costs.batching),
    "grid table": (DOCS / "benchmarks.md", grid.table),
    "grid verdicts": (DOCS / "benchmarks.md", grid.verdicts),
    "grid table after the split floor": (DOCS / "benchmarks.md", partial(grid.table, "grid_split_floor.json")),
    "grid verdicts after the split floor": (DOCS / "benchmarks.md", partial(grid.verdicts, "grid_split_floor.json")),
    "grid table with the arms alternated": (DOCS / "benchmarks.md", partial(grid.table, "grid_alternated.json")),
    "grid verdicts with the arms alternated": (DOCS / "benchmarks.md", partial(grid.verdicts, "grid_alternated.json")),
    "grid table after the calibration fix": (DOCS / "benchmarks.md", partial(grid.table, "grid_calibrated.json")),
    "grid verdicts after the calibration fix": (DOCS / "benchmarks.md", partial(grid.verdicts, "grid_calibrated.json")),
    "local weight-sync table": (DOCS / "benchmarks.md", transports.weight_sync_local),
    "bus table": (DOCS / "benchmarks.md", transports.bus),
    "sandbox table": (DOCS / "benchmarks.md", costs.sandbox),
    "adapters figures": (DOCS / "benchmarks.md", costs.adapters),
    "trainer crash table": (DOCS / "benchmarks.md", costs.resume),
    "engines table": (DOCS / "engines.md", engines.engines),
    "vLLM async-vs-sync table": (DOCS / "engines.md", async_sync.smollm2_vllm),
    "vLLM learning curves": (DOCS / "engines.md", learning.smollm2_vllm),
    "own-model curves": (DOCS / "own-model.md", learning.own_model),
    "own-model async-vs-sync table": (DOCS / "own-model.md", async_sync.own_model),
    "paper table": (DOCS / "simulator.md", paper.scales),
    "calculator table": (DOCS / "environments.md", async_sync.calculator_demos),
    "SmolLM2 calculator agent table": (DOCS / "environments.md", async_sync.smollm2_calculator_agent),
    "weight-sync table": (DOCS / "scaling-out.md", transports.weight_sync_across_hosts),
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
