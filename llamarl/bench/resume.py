"""`llamarl bench resume`: what a trainer crash costs, in groups dropped as stale and tickets
redone, against the same run left alone.

Interleaved pairs (undisturbed, crashed, undisturbed, crashed, ...), one pair per seed, both runs
of a pair from one shared supervised warm start and on the same prompts. In the crashed run the
trainer is SIGKILLed once the run has recorded `--kill-at` steps (a crash between checkpoints);
`llamarl run` restarts it, it resumes from its newest checkpoint, reopens the tickets trained after
it, and the run finishes. Per run: the share of issued tickets dropped as stale, tickets reopened
and reissued, wall time. The layout's profile (`workers.layout: auto`) is made once per pair, up
front, so that neither arm's wall time includes it (`profiled_in_run` says so per run). The output
ends with one JSON line (median, min and max per arm).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from llamarl.bench.async_vs_sync import drop_weights, profile_config, warm_start
from llamarl.bench.stats import spread
from llamarl.config import parse_config
from llamarl.config.run import read_tree
from llamarl.launch import supervise
from llamarl.store import RedisStore


def _metrics_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return sum(1 for line in path.open() if line.endswith("}\n")) if path.exists() else 0


def _trainer_pid(launcher: subprocess.Popen[str], run_id: str) -> int | None:
    """The pid the run's trainer registered in the run's Redis (its URL is in the environment
    the launcher gave its children)."""
    for pid in supervise.children(launcher.pid):
        try:
            pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        environ = dict(item.decode().split("=", 1) for item in pairs if b"=" in item)
        if "LLAMARL_REDIS_URL" not in environ:
            continue
        store = RedisStore(environ["LLAMARL_REDIS_URL"], run_id, connect_deadline_s=5)
        try:
            found = [w for w in store.workers() if w.worker_id == "trainer" and w.alive]
        finally:
            store.close()
        return int(found[0].fields["pid"]) if found else None
    return None


def run_once(tree: dict[str, Any], name: str, work_dir: Path, kill_at: int | None) -> dict:
    run_dir = work_dir / name
    variant = work_dir / f"{name}.yaml"
    variant.write_text(yaml.safe_dump(tree | {"run_dir": str(run_dir), "run_id": name}))
    llamarl = Path(sys.executable).parent / "llamarl"
    started = time.monotonic()
    launcher = subprocess.Popen(
        [str(llamarl), "--log-format", "json", "run", str(variant), "--mode", "async"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if kill_at is not None:
            while _metrics_steps(run_dir) < kill_at or (pid := _trainer_pid(launcher, name)) is None:
                if launcher.poll() is not None:
                    raise RuntimeError(f"run {name} ended before step {kill_at}")
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
        out, err = launcher.communicate()
    finally:
        supervise.stop(launcher)
    if launcher.returncode != 0:
        raise RuntimeError(f"run {name} failed: {err[-2000:]}")
    drop_weights(run_dir)
    summary = json.loads(out.strip().splitlines()[-1])
    ledger = summary["ledger"]
    layout = json.loads((run_dir / "layout.json").read_text())
    return {
        "profiled_in_run": not layout.get("prediction", {}).get("profile_cached", True),
        "issued": ledger["issued"],
        "dropped_stale": ledger["dropped_stale"],
        "dropped_pct": round(100 * ledger["dropped_stale"] / ledger["issued"], 2),
        "reopened": ledger.get("reopened", 0),
        "reissued": ledger.get("reissued", 0),
        "trainer_restarts": summary["restarts"].get("trainer", 0),
        "wall_s": round(time.monotonic() - started, 1),
    }


def bench(config_path: Path, seeds: list[int], steps: int, kill_at: int, work_dir: Path) -> dict[str, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    base = read_tree(config_path)
    base["trainer"] = base.get("trainer", {}) | {"num_steps": steps}
    pairs = []
    for index, seed in enumerate(seeds):
        tree = warm_start(base | {"seed": seed}, work_dir)
        profiled = work_dir / f"profile-{seed}.yaml"  # cached for both runs of the pair
        profiled.write_text(yaml.safe_dump(tree))
        profile_config(profiled)
        pair: dict[str, Any] = {"seed": seed}
        for arm, kill in (("undisturbed", None), ("crashed", kill_at)):
            pair[arm] = run_once(tree, f"resume-{arm}-{index}", work_dir, kill)
            print(f"pair {index} {arm}: {json.dumps(pair[arm])}", file=sys.stderr, flush=True)
        pairs.append(pair)
    return {
        "config": str(config_path),
        "steps": steps,
        "kill_at_step": kill_at,
        "checkpoint_every": parse_config(base).trainer.checkpoint_every,
        "pairs": pairs,
        **{
            f"{arm}_dropped_pct": spread([p[arm]["dropped_pct"] for p in pairs], 2)
            for arm in ("undisturbed", "crashed")
        },
        "crashed_reopened": spread([p["crashed"]["reopened"] for p in pairs], 0),
    }
