"""A finished run is never rewritten by a restart. After a short run ends, `llamarl run --resume`
and every role started again by hand on its Redis (`llamarl worker ROLE`, and a trainer rank
other than 0) each say in one line that the run finished, exit 0, and leave every file of the
run directory and every key of its Redis as they were, byte for byte; `llamarl run` without
--resume on that Redis (redis.url) refuses to start a new run under the same run_id (exit 2)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import redis

from brokers.redis_server import RedisServer
from llamarl.launch import supervise
from llamarl.net import free_port_block
from tests.integration.async_helpers import launch, worker_argv, write_config
from tests.integration.commands import LLAMARL

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

RUN_ID = "ended"
STEPS = 2
"""With a checkpoint at the last step, as in the compose run that was rewritten: a trainer
started on it found its run done and finished it again."""


def _files(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory, but the log of the run's Redis (started again here)."""
    return {
        str(path.relative_to(run_dir)): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and path != run_dir / "redis" / "redis.log"
    }


def _changed(before: Mapping[str, bytes | None], after: Mapping[str, bytes | None]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def _keys(url: str) -> dict[str, bytes | None]:
    """Every key of the Redis at `url`, serialized (DUMP)."""
    client = redis.Redis.from_url(url)
    try:
        return {key.decode(): client.dump(key) for key in client.scan_iter()}
    finally:
        client.close()


def _start_again(config: Path, run_dir: Path, url: str) -> dict[tuple[int, str], subprocess.Popen[str]]:
    """Every role started by hand on the finished run's Redis at `url` (a trainer's rank 1
    too), and `llamarl run` given that Redis, with and without --resume; each by the exit code
    and the line it must give."""
    env = {**os.environ, "LLAMARL_REDIS_URL": url, "LLAMARL_BROKER": f"127.0.0.1:{free_port_block()}"}
    ranks = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    commands = {
        (0, f"trainer t0: run {RUN_ID} finished; nothing to do"): (worker_argv("trainer", "t0", config), {}),
        (0, f"trainer t0-rank1: run {RUN_ID} finished; nothing to do"): (worker_argv("trainer", "t0", config), ranks),
        (0, f"generator g0: run {RUN_ID} finished; nothing to do"): (worker_argv("generator", "g0", config), {}),
        (0, f"reward r0: run {RUN_ID} finished; nothing to do"): (worker_argv("reward", "r0", config), {}),
        (0, f"run {RUN_ID} finished; nothing to resume (its results: {run_dir})"): (
            [*LLAMARL, "run", str(config), "--resume"],
            {},
        ),
        (
            2,
            f"config error: run_id {RUN_ID}: that run finished in the Redis at {url}; set another run_id (or "
            "LLAMARL_RUN_ID) to start a new run there",
        ): ([*LLAMARL, "run", str(config)], {}),
    }
    return {
        expected: supervise.start(argv, env=env | extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for expected, (argv, extra) in commands.items()
    }


def test_a_finished_run_is_left_as_it_was(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        RUN_ID,
        trainer={"num_steps": STEPS, "checkpoint_every": STEPS, "eval_every": STEPS},
        task={"num_eval": 4},
        workers={"num_generators": 1},
    )
    run_dir = tmp_path / RUN_ID
    proc = launch(config)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    files = _files(run_dir)

    again = subprocess.run(
        [*LLAMARL, "run", str(config), "--resume"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    changed = _changed(files, _files(run_dir))
    assert changed == [], f"llamarl run --resume rewrote the finished run: {changed}"
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.splitlines() == [f"run {RUN_ID} finished; nothing to resume (its results: {run_dir})"]

    server = RedisServer(run_dir / "redis").start()  # the run's own Redis, from its AOF
    try:
        keys = _keys(server.url)
        for expected, started in _start_again(config, run_dir, server.url).items():
            try:
                _, err = started.communicate(timeout=120)
            finally:
                supervise.stop(started)
            lines = [line for line in err.splitlines() if not line.startswith("{")]
            assert (started.returncode, lines) == (expected[0], [expected[1]]), err[-3000:]
        changed = _changed(keys, _keys(server.url))
        assert changed == [], f"a role started again changed the run's Redis: {changed}"
    finally:
        server.stop()
    changed = _changed(files, _files(run_dir))
    assert changed == [], f"a role started again rewrote the finished run: {changed}"
