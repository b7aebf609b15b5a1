"""One source per figure: docs/benchmarks.md states no measured figure outside the blocks
scripts/results_tables.py generates from docs/results, no page of README or docs/ states a
bench's median (min-max) outside one, and none names a commit (history, with its commits, is in
CHANGELOG.md)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_front_page import COMMIT

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FIGURE = re.compile(
    r"\b\d+\.\d+\b"  # a decimal: a time, a ratio, an accuracy
    r"|\b\d+(?:\.\d+)?x\b"  # a ratio
    r"|\b\d+(?:\.\d+)?\s?%"  # a share
    r"|\b\d+(?:\.\d+)?\s?(?:s/step|GB/s|MB/s|tokens/s|messages/s|MB/h|GiB|ms)\b"
)
"""What a measured figure looks like in prose; counts (3 pairs, 400 steps, 538 MB) are not."""
SPREAD = re.compile(r"\d+(?:\.\d+)?(?:x| s| ms| GB/s)? \(\d+(?:\.\d+)?-\d+(?:\.\d+)?\)")
"""A median with its min-max, as a bench's figure is written: on any page, only a generated block states one."""


def hand_written(text: str, figure: re.Pattern[str] = FIGURE) -> list[str]:
    """The lines of `text` outside code blocks and generated blocks that state a `figure`."""
    found, fenced, generated = [], False, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif "generated from docs/results by scripts/results_tables.py" in line:
            generated = True
        elif line.startswith("<!-- end of the generated"):
            generated = False
        elif not (fenced or generated) and figure.search(line):
            found.append(line)
    return found


def test_benchmarks_page_states_figures_only_in_generated_blocks() -> None:
    assert hand_written((REPO / "docs" / "benchmarks.md").read_text()) == []


def test_no_page_states_a_bench_figure_outside_generated_blocks() -> None:
    found = {str(page.relative_to(REPO)): hand_written(page.read_text(), SPREAD) for page in PAGES}
    assert {page: lines for page, lines in found.items() if lines} == {}


def test_no_page_names_a_commit() -> None:
    named = {str(page.relative_to(REPO)): COMMIT.findall(page.read_text()) for page in PAGES}
    assert {page: found for page, found in named.items() if found} == {}


def test_the_figure_check_finds_figures_outside_generated_blocks() -> None:
    text = "\n".join(
        [
            "Run 3 pairs of 400 steps on 538 MB.",
            "```bash",
            "llamarl bench bus   # 2.5 minutes",
            "```",
            "<!-- bus table: generated from docs/results by scripts/results_tables.py -->",
            "| raw | 82,214 (73,205-86,637) | 1.0 |",
            "<!-- end of the generated bus table -->",
            "The broker runs at 0.13 of raw.",
            "Async is 1.3x faster, 12% idle, 4 ms a pull, 2 GiB a rank.",
        ]
    )
    assert hand_written(text) == [
        "The broker runs at 0.13 of raw.",
        "Async is 1.3x faster, 12% idle, 4 ms a pull, 2 GiB a rank.",
    ]
    spread = "Sync took 0.515 s (0.449-0.522) and async 1.48x (1.23-1.52), from 2-3 runs of 4-5 minutes."
    assert hand_written(text + "\n" + spread, SPREAD) == [spread]
