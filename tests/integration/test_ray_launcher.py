"""`llamarl run CONFIG --launcher ray`: a whole async run with every role held by a Ray actor on
a local Ray instance the launcher starts and stops; what it refuses; what each role asks for."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from llamarl.config import parse_config
from llamarl.launch import supervise
from llamarl.launch.cores import plan_threads
from llamarl.launch.ray_actors import Resources, cpus_needed, role_resources, worker_roles
from tests.integration.async_helpers import check_finished_run, wait_for_steps, write_config
from tests.integration.commands import LLAMARL

REPO = Path(__file__).resolve().parents[2]
WORKER_IDS = {"trainer", "generator-0", "generator-1", "reward-0"}


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []  # exited meanwhile


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _worker_holders(pids: list[int]) -> dict[str, str]:
    """worker id -> the command line of the process that started it, for each role process
    among `pids`."""
    holders: dict[str, str] = {}
    for pid in pids:
        command = _cmdline(pid)
        if "--worker-id" in command and any(arg.startswith("workers.") for arg in command):
            worker_id = command[command.index("--worker-id") + 1]
            holders[worker_id] = " ".join(_cmdline(_parent(pid))).strip()
    return holders


def _refusal(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a person reads (JSON log records aside); no traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]


@pytest.mark.long
def test_async_run_with_every_role_a_ray_actor(tmp_path: Path) -> None:
    pytest.importorskip("ray")  # a guard: Ray is in the dev extra
    steps, per_step = 30, 4
    config = write_config(
        tmp_path, "ray", trainer={"num_steps": steps}, workers={"trainer_threads": 1, "generator_threads": 1}
    )
    run_dir = tmp_path / "ray"
    proc = supervise.start(
        [*LLAMARL, "run", str(config), "--launcher", "ray"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_steps(run_dir, 1, proc, timeout_s=240)
        tree = supervise.descendants(proc.pid)  # Ray's own processes among them
        holders = _worker_holders(tree)
        out, err = proc.communicate(timeout=300)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 0, err[-3000:]
    # Each role's process is the child of a Ray actor's, not of the launcher.
    assert set(holders) == WORKER_IDS, holders
    assert all(holder.startswith("ray::RoleActor") for holder in holders.values()), holders
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    actors = {r["worker_id"]: r for r in records if r["event"] == "role actor"}
    assert set(actors) == WORKER_IDS
    assert all(r["num_cpus"] == 1 and r["num_gpus"] == 0 for r in actors.values())
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["mode"] == "async" and summary["steps"] == steps
    assert summary["exit_codes"] == dict.fromkeys(WORKER_IDS, 0), summary["exit_codes"]
    assert summary["restarts"] == {}
    check_finished_run(summary, run_dir, steps * per_step, k=1)
    # Each actor sent its role's output where the local launcher does (a generator or reward
    # worker may have nothing to say; the trainer always reports its evaluations).
    assert {path.stem for path in (run_dir / "logs").glob("*.log")} == WORKER_IDS
    assert "evaluation" in (run_dir / "logs" / "trainer.log").read_text()
    # The actors, their role processes and the local Ray instance are all gone.
    assert supervise.wait_gone(tree, timeout_s=30) == []


def test_ray_launcher_refuses_sync_mode(tmp_path: Path) -> None:
    config = write_config(tmp_path, "raysync")
    done = subprocess.run(
        [*LLAMARL, "run", str(config), "--launcher", "ray", "--mode", "sync"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2
    (line,) = _refusal(done)
    assert line.startswith("config error: --launcher ray") and "--mode sync" in line, line
    assert not (tmp_path / "raysync").exists(), "refused before the run directory was made"


def test_ray_launcher_without_ray_says_how_to_install_it(tmp_path: Path) -> None:
    # A `ray` that fails to import, ahead of the installed one on the path.
    (tmp_path / "shadow" / "ray").mkdir(parents=True)
    (tmp_path / "shadow" / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    path = os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")])
    config = write_config(tmp_path, "noray")
    done = subprocess.run(
        [*LLAMARL, "run", str(config), "--launcher", "ray"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 2
    assert _refusal(done) == ["config error: --launcher ray needs Ray: pip install 'llamarl[ray]'"]
    assert not (tmp_path / "noray").exists()


def test_each_role_asks_ray_for_its_threads_and_devices() -> None:
    config = parse_config(
        {
            "workers": {
                "num_generators": 2,
                "num_reward": 1,
                "generator_threads": 1,
                "trainer_threads": 1,
            }
        }
    )
    split = plan_threads(config)  # explicit threads: nothing is measured
    requests = {wid: role_resources(config, split, role) for role, wid in worker_roles(config)}
    assert requests == dict.fromkeys(WORKER_IDS, Resources(num_cpus=1, num_gpus=0))
    assert cpus_needed(config, split) == 4

    config = parse_config(
        {
            "trainer": {"ranks": 2, "device": "cuda"},
            "generation": {"device": "cuda"},
            "workers": {
                "num_generators": 2,
                "num_reward": 1,
                "generator_threads": 3,
                "trainer_threads": 2,
            },
        }
    )
    split = plan_threads(config)
    requests = {wid: role_resources(config, split, role) for role, wid in worker_roles(config)}
    assert requests == {
        "trainer": Resources(num_cpus=4, num_gpus=2),  # threads and a GPU per rank
        "generator-0": Resources(num_cpus=3, num_gpus=1),
        "generator-1": Resources(num_cpus=3, num_gpus=1),
        "reward-0": Resources(num_cpus=1, num_gpus=0),
    }
    assert cpus_needed(config, split) == 11
