"""Soak benchmark (not a test): a long async run, sampling every process's RSS and Redis memory.

Starts `llamarl run CONFIG` with an effectively endless step count, samples each llamarl process
(found by the config path on its command line) and the run's redis-server (found by its working
directory) every `--interval` seconds, stops the run with SIGINT after `--minutes`, and prints
JSON: first and last RSS per process and the growth per hour from a least-squares slope.

    python scripts/bench_soak.py --minutes 20 --out runs/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
import yaml

REPO = Path(__file__).resolve().parent.parent


def _cmdline(pid: str) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _rss_mb(pid: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def sample(config_path: Path, redis_dir: Path) -> dict[str, float]:
    """RSS (MB) of every live process of the run, keyed by role or worker id."""
    out: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = _cmdline(entry.name)
            if str(config_path) in line:
                name = line.split("--worker-id ")[1].split()[0] if "--worker-id" in line else "launcher"
                out[name] = _rss_mb(entry.name)
            elif os.readlink(entry / "cwd") == str(redis_dir):
                out["redis-server"] = _rss_mb(entry.name)
                port = int(line.strip().rsplit(":", 1)[-1])
                used = redis.Redis(port=port).info("memory")["used_memory"]
                out["redis-used-memory"] = used / 1024 / 1024
        except (OSError, IndexError, ValueError, redis.RedisError):
            continue
    return out


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600 if var else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny.yaml"))
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--work-dir", default="runs/soak")
    parser.add_argument("--out")
    args = parser.parse_args()
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    tree = yaml.safe_load(Path(args.config).read_text())
    tree["run_id"], tree["run_dir"] = "soak", str(work / "run")
    tree.setdefault("trainer", {})["num_steps"] = 10_000_000
    config_path = work / "soak.yaml"
    config_path.write_text(yaml.safe_dump(tree))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "run", str(config_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    series: dict[str, list[tuple[float, float]]] = {}
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.minutes * 60 and launcher.poll() is None:
            time.sleep(args.interval)
            now = time.monotonic() - started
            for name, value in sample(config_path, work / "run" / "redis").items():
                series.setdefault(name, []).append((now, value))
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(120)
    metrics = (
        [json.loads(x) for x in (work / "run" / "metrics.jsonl").open()]
        if (work / "run" / "metrics.jsonl").exists()
        else []
    )
    result = {
        "minutes": round((time.monotonic() - started) / 60, 2),
        "steps": len(metrics),
        "processes": {
            name: {
                "first_mb": round(points[0][1], 1),
                "last_mb": round(points[-1][1], 1),
                "growth_mb_per_hour": round(slope_per_hour(points[len(points) // 4 :]), 1),
            }
            for name, points in sorted(series.items())
        },
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
