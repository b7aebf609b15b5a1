"""Shared fixtures: a real redis-server per test on a free port, a real broker process, and the
demo's warm start (made once per test session and shared by the runs that learn)."""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from brokers.broker_process import BrokerProcess, start_broker
from brokers.redis_server import RedisServer
from llamarl.curve import Curve
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints
from llamarl.store import RedisStore

REPO = Path(__file__).resolve().parent.parent

# Every `llamarl run` a test starts lays its roles out as `split` unless the test says otherwise:
# the default (auto) would profile the machine before each new config's first run (about 15 s).
# tests/integration/test_layout.py runs auto and colocated.
os.environ.setdefault("LLAMARL__WORKERS__LAYOUT", "split")
# Under `make test` the other pytest worker keeps the machine busy: a profile measured here (auto,
# `llamarl bench profile`) is kept, marked busy, where a user's would be measured again or refused
# (tests/integration/test_busy_profile.py, which unsets this).
os.environ.setdefault("LLAMARL_PROFILE_BUSY", "accept")

# Under `make test` two pytest workers share the 2 cores, each running processes of its own, and
# a process with a thread per core makes its threads wait for each other's core: the demo's warm
# start takes 36 s alone, 170 s beside two busy processes, 67 s there with one thread. Test
# processes, and the processes they start that do not set a thread count, use one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

LONGEST_FIRST = (
    "test_learning.py",  # about 290 s of a worker; makes the session's warm start first
    "test_chaos.py",  # 110 s
    "test_async_run.py",  # 145 s
    "test_trainer_ranks_run.py",  # 390 s; by the time it starts, the warm start is made
    "test_fuzz.py",
    "test_bad_input.py",
    "test_trainer_ranks.py",
    "test_curve.py",
    "test_weight_sync.py",
    "test_launcher_death.py",
    "test_restarts.py",
    "test_ray_launcher.py",
    "test_cluster_chaos.py",
)
"""The test files that take longest (measured with --durations=0 under `make test`), in the
order they should start. `make test` runs files in 2 pytest-xdist workers in collection order
(--dist loadfile --no-loadscope-reorder): each worker is first handed two files (the 1st and
3rd, the 2nd and 4th), then the next one whenever it is free. Collected first, the long files
start first, the two longest on different workers, and no worker is left running one alone at
the end."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its place


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    store = RedisStore(redis_server.url, "test", connect_deadline_s=5)
    yield store
    store.close()


_BROKER_LOGS = Path(tempfile.mkdtemp(prefix="llamarl-test-brokers-"))
atexit.register(shutil.rmtree, _BROKER_LOGS, True)


def start_broker_process(
    extra_env: dict[str, str] | None = None, curve: Curve | None = None, port: int | None = None
) -> BrokerProcess:
    """A real broker process on free ports it binds itself (or on `port`), answering."""
    env = {**os.environ, "LLAMARL_RUN_ID": "test", **(extra_env or {})}
    log_dir = Path(tempfile.mkdtemp(dir=_BROKER_LOGS))
    return start_broker(env, log_dir / "broker.log", port=port, curve=curve)


@pytest.fixture
def broker() -> Iterator[BrokerEndpoints]:
    started = start_broker_process()
    yield started.endpoints
    supervise.stop(started.process)


TINY = str(REPO / "configs" / "tiny.yaml")


@pytest.fixture(scope="session")
def tiny_warm_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`llamarl sft configs/tiny.yaml`: the demo's supervised warm start (its 200 steps, as a run
    does them before RL), written once as a checkpoint that learning runs start from
    (`model.path`, `trainer.sft_steps: 0`) instead of each repeating it. Under pytest-xdist the
    workers share one session directory and take turns on a lock: the first makes it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "tiny-warm-start"
    with open(shared / "tiny-warm-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / "config.json").exists():
            done = subprocess.run(
                [sys.executable, "-m", "workers.cli", "sft", TINY, "--out", str(out)],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert done.returncode == 0, done.stderr[-3000:]
    return out
