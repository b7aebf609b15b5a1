"""README as a front page: at most 200 lines, no commit hash, no sentence over 40 words; and the
generated blocks (README's headline and those of docs/ listed in scripts/results_tables.py's
TABLES) exactly what that script makes of the JSON and run records under docs/results."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_LINES = 200
MAX_WORDS = 40
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
"""Seven or more hex digits with a digit and a letter among them: how a commit hash looks."""


def prose(text: str) -> str:
    """README without its code blocks, tables, HTML comments and headings: what is read as
    sentences."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    keep = [line for line in text.splitlines() if not line.startswith(("|", "#", "<!--"))]
    return "\n".join(keep)


def sentences(text: str) -> list[str]:
    """Sentences of the prose; a list item or paragraph ends one too."""
    found = []
    for block in re.split(r"\n\s*\n|\n- ", prose(text)):
        flat = re.sub(r"\s+", " ", block).strip()
        found += [s for s in re.split(r"(?<=[.!?:])\s+(?=[A-Z`*\[])", flat) if s]
    return found


def test_readme_is_short_and_names_no_commit() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert COMMIT.findall(text) == [], "README names commits: history goes in CHANGELOG.md"


def test_no_readme_sentence_is_over_40_words() -> None:
    long = [s for s in sentences(README.read_text()) if len(s.split()) > MAX_WORDS]
    assert long == [], long


def test_the_checks_catch_what_they_look_for() -> None:
    assert COMMIT.findall("measured at commit 9911e37 and at ba52480") == ["9911e37", "ba52480"]
    assert COMMIT.findall("a deadbeef-free 1234567 figure") == []
    words = " ".join(["Word"] * 41) + "."
    text = f"Short one. {words} `Code` here.\n- An item\n- Another one"
    assert [len(s.split()) for s in sentences(text)] == [2, 41, 2, 2, 2]


def test_the_generated_tables_are_what_their_json_gives() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "results_tables.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
