"""A partition between hosts: the generators' host c is cut off from the head (a) and the
trainer's host (b) for 30 s and then restored, on links that also drop 1% of the packets
between the generators and the trainer. Nothing stops: every worker waits (Redis retries, the
bus watch, leases and heartbeats are sized above the cut, as configs/cluster.yaml sizes them),
the run finishes, nothing is lost or trained twice, the trainer's step times show the seconds
lost, and a worker of host c that was waiting on the bus reports how long it was silent."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from pathlib import Path

import yaml

from tests.conftest import REPO
from tests.integration.async_helpers import SMALL_RUN, check_finished_run, metrics_records
from tests.multihost.netns import Cluster
from tests.multihost.roles import Head, log_tail, summary, worker, write_config

CLUSTER = REPO / "configs" / "cluster.yaml"
STEPS = 40
CUT_AFTER = 10
CUT_S = 30.0
LOSS = 0.01


def test_a_30_second_partition_is_survived_with_the_ledger_balanced(tmp_path: Path) -> None:
    sized = yaml.safe_load(CLUSTER.read_text())  # the waits a multi-host run is given
    tree = {
        **SMALL_RUN,
        "trainer": {**SMALL_RUN["trainer"], "num_steps": STEPS, "eval_every": STEPS},
        "sync": {"transport": "gloo"},
        "redis": {"connect_deadline_s": sized["redis"]["connect_deadline_s"]},
        "broker": {"dead_after_s": sized["broker"]["dead_after_s"]},
        "staleness": {"max_staleness": 1, "lease_s": sized["staleness"]["lease_s"]},
    }
    config = write_config(tmp_path, "cut", tree)
    run_dir = tmp_path / "cut"
    logs = run_dir / "logs"
    with Cluster(["a", "b", "c"]) as cluster:
        head = Head(cluster, "a", run_dir, config).start()
        b, c = cluster["b"], cluster["c"]
        cluster.lossy("b", "c", LOSS)
        cluster.lossy("c", "b", LOSS)
        trainer_env = {**head.env, "LLAMARL__SYNC__HOST": b.address}
        procs = {"trainer": worker(b, "trainer", "trainer", config, trainer_env, logs)}
        for worker_id, role in (
            ("generator-0", "generator"),
            ("generator-1", "generator"),
            ("reward-0", "reward"),
        ):
            procs[worker_id] = worker(c, role, worker_id, config, head.env, logs)
        deadline = time.monotonic() + 300
        while len(metrics_records(run_dir)) < CUT_AFTER:
            assert time.monotonic() < deadline, log_tail(logs, "trainer")
            assert all(p.poll() is None for p in procs.values()), "a worker ended early"
            time.sleep(0.1)
        cluster.cut("c", "a")
        cluster.cut("c", "b")
        time.sleep(CUT_S)  # the partition lasts this long: nothing to wait for but the clock
        during = len(metrics_records(run_dir))
        cluster.heal("c", "a")
        cluster.heal("c", "b")
        for worker_id, proc in procs.items():
            assert proc.wait(600) == 0, log_tail(logs, worker_id)
        result = {**summary(run_dir), "ledger": head.ledger()}
    check_finished_run(result, run_dir, STEPS * 4, k=1)
    assert during < STEPS, "the run finished before the partition"
    walls = [r["wall_s"] for r in metrics_records(run_dir)]  # since the run started
    gaps = [later - earlier for earlier, later in itertools.pairwise(walls)]
    lost = max(gaps) - statistics.median(gaps)
    assert lost >= CUT_S / 2, f"only {lost:.1f} s lost to a {CUT_S:g} s cut: the cut never stalled the run"
    silent = [
        json.loads(line)["silent_s"]
        for worker_id in procs
        if worker_id != "trainer"
        for line in log_tail(logs, worker_id, 10**7).splitlines()
        if '"bus answers again"' in line
    ]
    assert silent and max(silent) >= CUT_S / 2, "no worker on host c reported the silence"
