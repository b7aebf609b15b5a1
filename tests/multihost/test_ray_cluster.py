"""A Ray cluster of three nodes, each a host of its own: `ray start --head` on a (with Redis and
the broker), `ray start --address` on b and c, each declaring a resource of its own.
`llamarl run --launcher ray` on a places the trainer on b and the generators and the reward
worker on c by the resources `workers.ray_resources` asks for, and the run finishes with the
ledger balanced. Then node c's processes are SIGKILLed mid-run (Ray's and the roles'): the
launcher sees its workers lost, as it sees a killed worker, and restarts them once node c is
back, and the run finishes."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from tests.integration.async_helpers import SMALL_RUN, check_finished_run, metrics_records
from tests.multihost.netns import Cluster, Host, kill_namespace
from tests.multihost.roles import Head, write_config

pytest.importorskip("ray")  # a guard: Ray is in the dev extra
RAY_PORT = 6380
RAY = [str(Path(sys.executable).parent / "ray")]
STEPS = 30
NODES = {"b": ("trainer_node", 2), "c": ("generator_node", 3)}
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
"""Ray's cluster token: every node and the launcher's driver present it."""


def start_node(host: Host, head: str | None, logs: Path) -> None:
    """`ray start --block` on `host`: the head when `head` is None, else joining it."""
    common = ["--node-ip-address", host.address, "--disable-usage-stats", "--block"]
    if head is None:
        command = [
            "start",
            "--head",
            f"--port={RAY_PORT}",
            "--num-cpus=0",
            "--include-dashboard=false",
        ]
    else:
        resource, cpus = NODES[host.name]
        command = [
            "start",
            f"--address={head}:{RAY_PORT}",
            f"--num-cpus={cpus}",
            f"--resources={json.dumps({resource: cpus})}",
        ]
    env = {**os.environ, **AUTH}
    host.start([*RAY, *command, *common], env=env, log=logs / f"ray-{host.name}.log")


def test_a_ray_cluster_of_three_nodes_places_the_roles_and_survives_a_lost_node(
    tmp_path: Path,
) -> None:
    tree = {
        **SMALL_RUN,
        "trainer": {**SMALL_RUN["trainer"], "num_steps": STEPS, "eval_every": STEPS},
        "sync": {"transport": "gloo"},
        "workers": {
            **SMALL_RUN["workers"],
            "trainer_threads": 1,
            "generator_threads": 1,
            "ray_resources": {
                "trainer": {"trainer_node": 1},
                "generator": {"generator_node": 1},
                "reward": {"generator_node": 1},
            },
        },
    }
    config = write_config(tmp_path, "ray", tree)
    run_dir = tmp_path / "ray"
    logs = run_dir / "logs"
    with Cluster(["a", "b", "c"]) as cluster:
        head = Head(cluster, "a", run_dir, config).start()
        a, c = cluster["a"], cluster["c"]
        start_node(a, None, logs)
        for name in NODES:
            start_node(cluster[name], a.address, logs)
        launcher = a.start(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "run",
                str(config),
                "--launcher",
                "ray",
                "--ray-address",
                f"{a.address}:{RAY_PORT}",
            ],
            env={**head.env, **AUTH, "LLAMARL__SYNC__HOST": "0.0.0.0"},
            log=tmp_path / "launcher.log",
        )
        deadline = time.monotonic() + 300
        while len(metrics_records(run_dir)) < 10:
            assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()[-3000:]
            time.sleep(0.2)
        placed = head.hosts_of_workers()
        kill_namespace(c)  # node c lost: its raylet, its actors and their roles
        start_node(c, a.address, logs)  # the node comes back
        assert launcher.wait(600) == 0, (tmp_path / "launcher.log").read_text()[-3000:]
    printed = (tmp_path / "launcher.log").read_text().strip().splitlines()[-1]
    result = json.loads(printed)  # the launcher's summary: the trainer's, ledger and restarts
    check_finished_run(result, run_dir, STEPS * 4, k=1)
    assert placed == {"trainer": "b", "generator-0": "c", "generator-1": "c", "reward-0": "c"}
    assert {"generator-0", "generator-1", "reward-0"} <= set(result["restarts"]), result
