"""The documentation against the code it describes.

- The configuration reference (docs/reference/configuration.md) holds every row that
  `scripts/config_reference.py` prints: every config field, its type, default and meaning
  (regenerate with `python scripts/config_reference.py` and paste when a field changes).
- Every `llamarl ...` command named in README.md or a docs page answers `--help` with exit 0.
- Every relative link of README.md reaches a file, and a heading of it when it names one.

`mkdocs build --strict` (`make docs`, run by .ci/run) checks the links between docs pages.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workers import cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CONFIG_PAGE = REPO / "docs" / "reference" / "configuration.md"

FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(`+)((?:(?!\n\n).)+?)\1", re.S)
# `llamarl` as a command (also `.venv/bin/llamarl`), not a path (`llamarl/`), a key
# (`llamarl:run:`), an extra (`llamarl[ray]`) or a metric (`llamarl_busy_s`).
INVOCATION = re.compile(r"(?<![\w-])llamarl[ \t]+(.*)")
WORD = re.compile(r"[a-z][a-z0-9-]*")
CLOSING = set("`'\"),.;:")


def _docs() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def _code(text: str) -> list[str]:
    """Every line of code in a Markdown text: fenced blocks line by line, inline spans each as
    one line (a span wrapped over two lines is joined)."""
    lines = [line for block in FENCED.findall(text) for line in block.splitlines()]
    prose = FENCED.sub("", text)
    return lines + [span.replace("\n", " ") for _, span in INLINE.findall(prose)]


def command_words(rest: str) -> tuple[str, ...]:
    """The subcommand path at the start of what follows `llamarl`: lowercase words, up to the
    first option (`--mode`), path (`configs/tiny.yaml`), placeholder (`RUN_DIR`), override
    (`trainer.lr=1e-5`) or anything else that is not a plain word. A word ending the code span
    or the sentence (`generate`)`, `sync.`) is kept."""
    words: list[str] = []
    for token in rest.split():
        match = WORD.match(token)
        if match is None:
            break
        tail = token[match.end() :]
        if tail and not set(tail) <= CLOSING:
            break
        words.append(match[0])
        if tail:
            break
    return tuple(words)


def documented_commands() -> dict[tuple[str, ...], str]:
    """Each distinct `llamarl` subcommand path the docs name, with the first file naming it."""
    found: dict[tuple[str, ...], str] = {}
    for path in _docs():
        for line in _code(path.read_text()):
            for match in INVOCATION.finditer(line):
                words = command_words(match[1])
                if words:
                    found.setdefault(words, str(path.relative_to(REPO)))
    return found


def test_command_words_stop_at_the_first_argument() -> None:
    assert command_words("run configs/tiny.yaml --mode sync") == ("run",)
    assert command_words("bench async-vs-sync --config configs/tiny.yaml") == (
        "bench",
        "async-vs-sync",
    )
    assert command_words("worker ROLE --metrics-port PORT") == ("worker",)
    assert command_words("sim configs/tiny.yaml workers.num_generators=2") == ("sim",)
    assert command_words("keys generate`)") == ("keys", "generate")
    assert command_words("export RUN_DIR OUT") == ("export",)


def _help(words: tuple[str, ...]) -> tuple[object, str]:
    """`llamarl WORDS --help` in this process, through the parser `workers.cli` builds: the exit
    code and what it printed. `worker ROLE` hands its arguments to the role's own parser, so a
    namespace that comes back is run as the command would run it (its `--help` exits there)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            args = cli.build_parser().parse_args([*words, "--help"])
            args.func(args)
        except SystemExit as stop:
            return stop.code, out.getvalue()
    return "returned without exiting", out.getvalue()


@pytest.mark.timeout(300)
def test_every_documented_command_answers_help() -> None:
    commands = documented_commands()
    # the extraction finds what the front page and the docs are known to name
    assert {("run",), ("bench", "async-vs-sync"), ("sim",), ("worker", "trainer")} <= set(commands)
    failed = []
    for words, source in sorted(commands.items()):
        code, printed = _help(words)
        usage = "usage: llamarl " + " ".join(words)
        if code not in (0, None) or usage not in printed:
            failed.append(f"llamarl {' '.join(words)} --help (named in {source}): exit {code}")
    assert failed == [], "\n".join(failed)


def test_config_reference_is_current() -> None:
    table = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "config_reference.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=REPO,
    ).stdout
    page = set(CONFIG_PAGE.read_text().splitlines())
    missing = [row for row in table.splitlines() if row not in page]
    assert missing == [], "regenerate the table with python scripts/config_reference.py"


def _slug(heading: str) -> str:
    """A heading's anchor, as both GitHub and mkdocs (toc) write it for plain headings."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    text = FENCED.sub("", path.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M)}


def test_readme_links_reach_the_docs() -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        path = REPO / file
        if not path.is_file() or (anchor and anchor not in _anchors(path)):
            broken.append(target)
    assert broken == [], f"README.md links to what does not exist: {broken}"
