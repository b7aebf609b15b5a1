"""A cluster taken down and brought up again at random points, as `docker compose down` / `up`
does, then brought up once more after it finished.

Every role is started on its own with `llamarl worker ROLE --config`, as the compose file starts
its containers (configs/cluster.yaml's settings, on loopback, with a small model so a run takes
minutes on 2 cores). Redis keeps its append-only file and the run directory its files across a
restart, as compose's volumes do. A `down` sends every role SIGTERM at once, waits for each to
end (the trainer writes its stop checkpoint), then stops the broker and Redis; an `up` starts
Redis (from its file, on a new port) and the broker again, then every role: the trainer's weight
server binds a new port, as a new container's does.

Checked, each a line on stderr and exit 1 when it fails:
- after every `up`, every generator takes up a version of the new trainer and publishes groups
  within PRODUCE_BOUND_S of that version's publish;
- the run finishes; no ticket and no rollout is trained twice; the ledger balances with nothing
  open; steps and versions in metrics.jsonl go up one record a step; summary.json agrees with
  the last metrics record;
- an `up` of the finished run ends every role at once with exit 0 and changes no file of the
  run directory.

    python scripts/chaos_restarts.py --out runs/chaos/result.json [--restarts 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brokers.embedded import EmbeddedServices  # noqa: E402
from llamarl.store import RedisStore  # noqa: E402

STEPS = 120
GENERATORS = ("generator-0", "generator-1")
ROLES = {"trainer": "trainer", "reward-0": "reward", **{g: "generator" for g in GENERATORS}}
PRODUCE_BOUND_S = 60.0
"""How soon after the new trainer's first publish every generator must have produced (a
generator that waited out the old trainer's endpoint took `sync.timeout_s`, here 300 s)."""
START_S = 300.0
"""Patience for processes to start and a run to get going on a loaded machine."""
STOP_S = 150.0
"""Longer than the trainer's stop grace in docker-compose.yml (130 s)."""


def write_config(directory: Path) -> Path:
    """configs/cluster.yaml with its addresses left to the environment, a small model and run."""
    tree = yaml.safe_load((REPO / "configs" / "cluster.yaml").read_text())
    del tree["redis"]["url"]
    for key in ("host", "port"):
        tree["broker"].pop(key)
    tree |= {"run_id": "chaos", "run_dir": str(directory / "chaos")}
    tree["model"] = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    tree["generation"] = {"num_samples": 2, "max_new_tokens": 4, "prompts_per_batch": 2}
    tree["trainer"] = {"prompts_per_step": 4, "num_steps": STEPS, "eval_every": 20, "checkpoint_every": 10}
    tree["trainer"] |= {"sft_steps": 0}
    tree["task"] = {"num_eval": 20}
    tree["sync"] |= {"host": "127.0.0.1", "timeout_s": 300.0}
    tree["workers"] |= {"heartbeat_s": 0.5}
    path = directory / "chaos.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


class Cluster:
    """Redis, the broker and every role of one run, brought up and down together."""

    def __init__(self, config: Path, run_dir: Path) -> None:
        self.config, self.run_dir = config, run_dir
        self.logs = run_dir / "logs"
        self.services: EmbeddedServices | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def up(self) -> RedisStore:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.services = EmbeddedServices(self.run_dir, "chaos").start()
        env = {**os.environ, **self.services.env(), "OMP_NUM_THREADS": "1"}
        for worker_id, role in ROLES.items():
            argv = [sys.executable, "-m", "workers.cli", "worker", role, "--config", str(self.config)]
            argv += ["--worker-id", worker_id, "--log-format", "json"]
            with open(self.logs / f"{worker_id}.log", "ab") as log:
                self.procs[worker_id] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        return RedisStore(self.services.redis_url, "chaos", connect_deadline_s=30)

    def ended(self) -> bool:
        """Whether every role has exited."""
        return all(proc.poll() is not None for proc in self.procs.values())

    def stop_roles(self) -> dict[str, int | None]:
        """SIGTERM every role at once; each one's exit code once it ends (SIGKILL past STOP_S)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {worker_id: _wait(proc, STOP_S) for worker_id, proc in self.procs.items()}
        self.procs = {}
        return codes

    def down(self) -> dict[str, int | None]:
        """The roles, then the broker and Redis."""
        codes = self.stop_roles()
        if self.services is not None:
            self.services.stop()
        self.services = None
        return codes


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Seconds until `condition` held; RuntimeError naming `what` past `timeout_s`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{what} within {timeout_s:g} s")
        time.sleep(0.1)
    return time.monotonic() - started


def produced(store: RedisStore, pids: dict[str, int], policy_version: int) -> bool:
    """Whether each generator process (by pid) has taken up `policy_version` or a newer one and
    published groups."""
    beats = {w.worker_id: w.fields for w in store.workers() if w.alive}
    for worker_id, pid in pids.items():
        fields = beats.get(worker_id, {})
        if fields.get("pid") != str(pid) or int(fields.get("policy_version", -1)) < policy_version:
            return False
        if float(fields.get("groups", 0)) <= 0:
            return False
    return True


def reached(store: RedisStore, step: int) -> bool:
    """Whether the run has trained `step` steps' groups."""
    return store.ledger()["trained"] >= 4 * step


def restart_after_up(cluster: Cluster, store: RedisStore, version_before: int) -> dict[str, Any]:
    """Wait for the new trainer's first version, then for every generator to produce with it."""
    wait_for(lambda: store.policy_version() > version_before, "no new version from the restarted trainer", START_S)
    published = store.policy_version()
    pids = {g: cluster.procs[g].pid for g in GENERATORS}
    seconds = wait_for(lambda: produced(store, pids, published), "a generator did not produce", PRODUCE_BOUND_S)
    return {"resumed_version": published, "generators_produced_s": round(seconds, 2)}


def digest(run_dir: Path) -> dict[str, str]:
    """Every file of the run directory but the logs (each start appends to its own) by hash."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.suffix != ".log"
    }


def check_finished(run_dir: Path, ledger: dict[str, int]) -> list[str]:
    """What a finished run must hold (see the module's doc); the problems found."""
    problems = []
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").open()]
    groups = STEPS * 4
    if len(trained) != groups or len({e["rollout_id"] for e in trained}) != groups:
        problems.append(f"trained.jsonl: {len(trained)} entries, {len({e['rollout_id'] for e in trained})} rollouts")
    if len({e["ticket_id"] for e in trained}) != len(trained):
        problems.append("a ticket was trained twice")
    ended = ledger["trained"] + ledger["skipped"] + ledger["dropped_stale"]
    if ledger["issued"] != ended + ledger["open"] or ledger["open"] != 0 or ledger["trained"] != groups:
        problems.append(f"the ledger does not balance: {ledger}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    versions = [r["policy_version"] for r in records]
    if [r["step"] for r in records] != list(range(1, STEPS + 1)) or versions != sorted(set(versions)):
        problems.append("metrics.jsonl: steps or versions out of order")
    summary = json.loads((run_dir / "summary.json").read_text())
    last_evaluated = [r for r in records if "held_out_accuracy" in r][-1]
    if summary["steps"] != STEPS or summary["final_accuracy"] != last_evaluated["held_out_accuracy"]:
        problems.append(f"summary.json {summary} disagrees with the metrics' last evaluation {last_evaluated}")
    return problems


def run(directory: Path, restarts: int, seed: int) -> dict[str, Any]:
    cluster = Cluster(write_config(directory), directory / "chaos")
    try:
        return cycles(cluster, restarts, random.Random(seed)) | {"seed": seed}
    finally:
        cluster.down()  # whatever is left after a failure


def cycles(cluster: Cluster, restarts: int, rng: random.Random) -> dict[str, Any]:
    """Down and up `restarts` times, run to the end, up once more; the result (see main)."""
    run_dir = cluster.run_dir
    # A restart at a random step of each of `restarts` equal stretches of the run's first 80%.
    stretch = int(STEPS * 0.8) // restarts
    points = [rng.randrange(i * stretch + 5, (i + 1) * stretch) for i in range(restarts)]
    result: dict[str, Any] = {"steps": STEPS, "restarts": []}
    store = cluster.up()
    for point in points:
        wait_for(partial(reached, store, point), f"the run did not reach step {point}", START_S)
        codes = cluster.stop_roles()
        version = store.policy_version()  # with the stopped trainer's last publish
        store.close()
        cluster.down()
        store = cluster.up()
        entry = {"at_step": len((run_dir / "metrics.jsonl").read_text().splitlines()), "exit_codes": codes}
        result["restarts"].append(entry | restart_after_up(cluster, store, version))
    wait_for(cluster.ended, "the run did not finish and end every role", 20 * START_S)
    result["final_exit_codes"] = {worker_id: proc.returncode for worker_id, proc in cluster.procs.items()}
    result["ledger"] = store.ledger()
    store.close()
    cluster.down()
    result["problems"] = check_finished(run_dir, result["ledger"])
    before = digest(run_dir)
    store = cluster.up()  # `up` of the finished run: every role says so and ends
    seconds = wait_for(cluster.ended, "roles kept running on the finished run", START_S)
    codes = {worker_id: proc.returncode for worker_id, proc in cluster.procs.items()}
    store.close()
    cluster.down()
    after = digest(run_dir)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    result["finished_up"] = {"exit_codes": codes, "ended_in_s": round(seconds, 2), "changed_files": changed}
    if set(codes.values()) != {0} or changed:
        result["problems"].append(f"up of the finished run: exit codes {codes}, changed {changed}")
    if set(result["final_exit_codes"].values()) != {0}:
        result["problems"].append(f"the finished run's roles exited {result['final_exit_codes']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the result as JSON")
    parser.add_argument("--restarts", type=int, default=3, help="down/up cycles during the run")
    parser.add_argument("--seed", type=int, default=0, help="picks the steps the cycles happen at")
    parser.add_argument("--dir", type=Path, help="where the run goes (default: beside --out)")
    args = parser.parse_args()
    directory = args.dir or args.out.parent / "chaos-run"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        result = run(directory, args.restarts, args.seed)
    except Exception as err:  # reported as the check's failure, with the JSON written
        result = {"problems": [f"{type(err).__name__}: {err}"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for problem in result["problems"]:
        print(f"chaos: {problem}", file=sys.stderr)
    print(json.dumps(result))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
