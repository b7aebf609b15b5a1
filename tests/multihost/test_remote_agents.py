"""An agent server on a host of its own (`environment.agent_url`, `llamarl agent serve`): the
calculator agent (examples/calculator_agent.py, unchanged) plays every episode of a `llamarl run`
on this machine, reaching the generators' endpoint across the bridge. SIGKILLed mid-run, its
episodes in flight are lost; they are handed out again under new keys to the server started in its
place, and the run finishes with every ticket trained once and the ledger balanced."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from llamarl.agents.remote import AGENT_TOKEN
from tests.conftest import REPO
from tests.integration.async_helpers import check_finished_run, wait_for_steps
from tests.multihost.netns import Cluster
from tests.multihost.roles import write_config

STEPS = 10
PORT = 8100
TOKEN = "a-test-secret-of-32-characters!!"


def _listening(address: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex((address, port)) == 0:
                return True
        time.sleep(0.2)
    return False


def test_an_agent_server_on_another_host_trains_and_one_killed_has_its_episodes_reissued(tmp_path: Path) -> None:
    tree = yaml.safe_load((REPO / "configs" / "episodes" / "calculator_agent.yaml").read_text())
    env = os.environ | {AGENT_TOKEN: TOKEN, "PYTHONPATH": str(REPO)}
    with Cluster(["agents"]) as cluster:
        host = cluster["agents"]
        tree["environment"] = {
            key: value for key, value in tree["environment"].items() if key not in ("agent", "demonstration")
        } | {"agent_url": f"http://{host.address}:{PORT}", "max_reissues": 20}
        tree["generation"]["openai"] = {"host": cluster.gateway}
        tree["trainer"] |= {"num_steps": STEPS, "eval_every": STEPS, "sft_steps": 0}
        tree["task"] |= {"num_eval": 16}
        tree["workers"] = {"num_generators": 2, "heartbeat_s": 0.5}
        config = write_config(tmp_path, "remote", tree)
        run_dir = tmp_path / "remote"
        serve = [sys.executable, "-m", "workers.cli", "agent", "serve", "--agent", "examples.calculator_agent:agent"]
        serve += ["--host", host.address, "--port", str(PORT)]
        first = host.start(serve, env, tmp_path / "agents-1.log")
        assert _listening(host.address, PORT, 60), (tmp_path / "agents-1.log").read_text()[-2000:]
        with open(tmp_path / "run.err", "w") as err:
            run = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "run", str(config)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        try:
            wait_for_steps(run_dir, 3, run, timeout_s=300)
            os.killpg(first.pid, signal.SIGKILL)  # mid-episode: the generators keep it busy
            first.wait(30)
            host.start(serve, env, tmp_path / "agents-2.log")
            out, _ = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(30)
        assert run.returncode == 0, (tmp_path / "run.err").read_text()[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    check_finished_run(
        summary, run_dir, STEPS * tree["trainer"]["prompts_per_step"], k=tree["staleness"]["max_staleness"]
    )
    counters = [json.loads(path.read_text()) for path in (run_dir / "timers").glob("generator-*.json")]
    assert sum(c.get("agent_episodes_reissued", 0) for c in counters) >= 1, counters
    assert sum(c.get("episode_turns", 0) for c in counters) > 0
