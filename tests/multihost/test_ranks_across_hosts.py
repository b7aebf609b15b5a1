"""A trainer whose ranks span hosts: two ranks on host b and two on host d (one torchrun per
host, a c10d rendezvous on b) take the same optimizer steps as four ranks on one host, within
1e-5 of the largest weight, with ddp and with fsdp; and in a run, they send their shards to
generators on a third host and resume from their sharded checkpoint after one host is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.integration.async_helpers import SMALL_RUN, check_finished_run, metrics_records
from tests.multihost.netns import Cluster, Host
from tests.multihost.roles import Head, log_tail, summary, timers, worker, write_config
from tests.multihost.torchrun import multi_node, one_node

TOLERANCE = 1e-5
STEPS = ["-m", "tests.multihost.rank_steps"]
RUN_STEPS = 30


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_plus_two_ranks_across_hosts_take_the_steps_of_four_on_one(tmp_path: Path, sharding: str) -> None:
    alone, across = tmp_path / "alone.npy", tmp_path / "across.npy"
    with Cluster(["b", "d"]) as cluster:
        b, d = cluster["b"], cluster["d"]
        one = b.start([*one_node(4), *STEPS, sharding, str(alone)], log=tmp_path / "one.log")
        assert one.wait(300) == 0, (tmp_path / "one.log").read_text()[-3000:]
        agents = [
            host.start(
                [*multi_node(b.address, host.address, 2, 2), *STEPS, sharding, str(across)],
                log=tmp_path / f"{host.name}.log",
            )
            for host in (b, d)
        ]
        for host, agent in zip((b, d), agents, strict=True):
            assert agent.wait(300) == 0, (tmp_path / f"{host.name}.log").read_text()[-3000:]
    expected, weights = np.load(alone), np.load(across)
    difference = np.abs(weights - expected).max()
    assert difference <= TOLERANCE * np.abs(expected).max(), difference


def test_fsdp_ranks_on_two_hosts_sync_shards_and_resume_after_a_host_is_killed(
    tmp_path: Path,
) -> None:
    """A run whose fsdp trainer has ranks 0-1 on host b and 2-3 on host d (Redis and the broker
    on a, generators and the reward worker on c): each rank sends its shard of every version
    to the generators over gloo, and all write sharded checkpoints to the run directory both
    hosts see. Host d's torchrun is SIGKILLed mid-run (its ranks die with it), which ends b's
    ranks too; both hosts' torchruns are started again as before (as a scheduler restarts a
    failed job): every rank resumes from the newest sharded checkpoint, the run finishes and
    the ledger balances."""
    tree = {
        **SMALL_RUN,
        "trainer": {
            **SMALL_RUN["trainer"],
            "num_steps": RUN_STEPS,
            "checkpoint_every": 5,
            "eval_every": RUN_STEPS,
            "sharding": "fsdp",
            "ranks": 4,
        },
        "sync": {"transport": "gloo"},
    }
    config = write_config(tmp_path, "ranks", tree)
    run_dir = tmp_path / "ranks"
    logs = run_dir / "logs"
    trainer = [
        "-m",
        "workers.trainer",
        "--config",
        str(config),
        "--worker-id",
        "trainer",
        "--log-format",
        "json",
    ]
    with Cluster(["a", "b", "c", "d"]) as cluster:
        head = Head(cluster, "a", run_dir, config).start()
        b, c, d = cluster["b"], cluster["c"], cluster["d"]

        def node(host: Host) -> subprocess.Popen[bytes]:
            env = {**head.env, "LLAMARL__SYNC__HOST": host.address}
            command = multi_node(b.address, host.address, 2, 2)
            return host.start([*command, *trainer], env=env, log=logs / f"trainer-{host.name}.log")

        agents = {"b": node(b), "d": node(d)}
        others = [worker(c, "generator", f"generator-{i}", config, head.env, logs) for i in range(2)] + [
            worker(c, "reward", "reward-0", config, head.env, logs)
        ]
        deadline = time.monotonic() + 300
        while not list((run_dir / "checkpoints").glob("step-*/shards")) or len(metrics_records(run_dir)) < 8:
            assert time.monotonic() < deadline, (logs / "trainer-b.log").read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(agents["d"].pid, signal.SIGKILL)  # host d's torchrun and its ranks
        agents["d"].wait(30)
        assert agents["b"].wait(300) != 0, "b's ranks went on without d's"
        agents = {"b": node(b), "d": node(d)}  # the trainer started again, as a job is
        for name, agent in agents.items():
            assert agent.wait(600) == 0, (logs / f"trainer-{name}.log").read_text()[-3000:]
        for proc in others:
            assert proc.wait(60) == 0, log_tail(logs, "generator-0")
        result = {**summary(run_dir), "ledger": head.ledger()}
    check_finished_run(result, run_dir, RUN_STEPS * 4, k=1)
    records = metrics_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, RUN_STEPS + 1))
    resumes = [
        line
        for line in logs.glob("trainer*.log")
        for line in line.read_text().splitlines()
        if '"event": "resumed"' in line
    ]
    assert resumes and all(json.loads(line)["step"] >= 5 for line in resumes), resumes
    for generator in ("generator-0", "generator-1"):
        assert timers(run_dir, generator)["syncs"] >= 2, log_tail(logs, generator)
