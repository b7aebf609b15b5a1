"""Episodes turn by turn, for people: `llamarl plot` writes episodes.md from each run's
samples.jsonl (the held-out episodes every evaluation keeps), first and last evaluation side by
side: who wrote each turn (the prompt, the model with the version that sampled it, the
environment or a tool), what it wrote, how the episode ended and its reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "episodes.md"


def _evaluations(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [e for e in entries if any("turns" in s for s in e.get("samples", []))]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def _episode(sample: dict[str, Any]) -> list[str]:
    lines = [
        "| turn | who | text |",
        "|---|---|---|",
        f"| 0 | prompt | {_cell(sample['prompt'])} |",
    ]
    for number, turn in enumerate(sample["turns"], start=1):
        who = turn["role"]
        if who == "assistant":
            version = turn.get("policy_version")
            who = "model" if version is None else f"model (v{version})"
        lines.append(f"| {number} | {who} | {_cell(turn['content'])} |")
    lines.append("")
    lines.append(f"ended: {sample['end']}; answer {sample['answer']}; reward {sample['reward']}")
    return lines + [""]


def write_episodes(run_dirs: list[Path], out: Path) -> Path | None:
    """episodes.md in `out` for the runs that played episodes; None when none did."""
    lines: list[str] = []
    for run_dir in run_dirs:
        evaluations = _evaluations(run_dir)
        if not evaluations:
            continue
        lines.append(f"# {run_dir.name}")
        chosen = [evaluations[0], evaluations[-1]] if len(evaluations) > 1 else evaluations
        for evaluation in chosen:
            lines += ["", f"## step {evaluation['step']}: held-out accuracy {evaluation['accuracy']}", ""]
            for sample in evaluation["samples"]:
                lines += _episode(sample)
    if not lines:
        return None
    path = out / FILE
    path.write_text("\n".join(lines))
    return path
