"""`llamarl bench async-vs-sync`: the same config run both ways, side by side, in one go.

Reports per mode: RL wall time per trainer step, time (from the start of RL) to reach a target
held-out accuracy, final accuracy, and the busy fraction of each role from the workers' own timers.
A benchmark, not a test: numbers depend on the machine; the ratio is what to compare.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def _run(config_path: Path, mode: str, run_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "llamarl.cli", "--log-format", "json", "run", str(config_path),
         "--mode", mode],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed: {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    summary["records"] = records
    return summary


def _time_to(records: list[dict[str, Any]], target: float) -> float | None:
    for record in records:
        if record.get("held_out_accuracy", -1.0) >= target:
            return round(float(record["rl_s"]), 2)
    return None


def _busy_fractions(run_dir: Path) -> dict[str, float]:
    out = {}
    for path in sorted((run_dir / "timers").glob("*.json")):
        timer = json.loads(path.read_text())
        total = timer["busy_s"] + timer["idle_s"]
        out[path.stem] = round(timer["busy_s"] / total, 3) if total else 0.0
    return out


def bench(config_path: Path, target: float, work_dir: Path) -> dict[str, Any]:
    tree = yaml.safe_load(config_path.read_text())
    work_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": str(config_path), "target_accuracy": target}
    for mode in ("sync", "async"):
        run_dir = work_dir / mode
        variant = work_dir / f"{mode}.yaml"
        variant.write_text(
            yaml.safe_dump(tree | {"run_dir": str(run_dir), "run_id": f"bench-{mode}"})
        )
        summary = _run(variant, mode, run_dir)
        records = summary.pop("records")
        result[mode] = summary | {
            "s_per_step": round(summary["rl_wall_s"] / summary["steps"], 4),
            "time_to_target_s": _time_to(records, target),
            "busy_fraction": _busy_fractions(run_dir) if mode == "async" else {"sync": 1.0},
        }
    result["async_speedup_per_step"] = round(
        result["sync"]["s_per_step"] / result["async"]["s_per_step"], 3
    )
    return result


def main(args: argparse.Namespace) -> int:
    result = bench(Path(args.config), args.target, Path(args.work_dir))
    text = json.dumps(result, indent=None if args.json else 2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0
