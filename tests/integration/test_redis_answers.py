"""Every answer a Redis can give a process at its start instead of a reply (DENIED, NOAUTH,
WRONGPASS, READONLY, OOM, LOADING) is one line and an exit code, never a traceback: for `llamarl
run` with redis.url, every worker and `llamarl monitor` (which only reads, so a replica or a full
Redis serves it). A mistake in the settings of Redis or of redis.url exits 2, a Redis unable for
now 3 (`llamarl run` 1, as for an unreachable Redis). Each row is in the bad-input table of
docs/operations.md (HOST is this host's address, TMP the test's directory, PORT a port).
Every entry point is started as a process on some answer; the rows whose entry point another row
starts meet their answer through the same code in this process. The Redis servers are real but
LOADING's (tests/integration/redis_answers.py says why)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml

from brokers.redis_server import RedisServer
from brokers.run_status import run_finished, worker_finished
from llamarl.config import load_config
from llamarl.errors import ConfigError
from llamarl.launch import supervise
from llamarl.store import RedisStore
from llamarl.store.refusals import RedisUnavailableError
from tests.integration.commands import LLAMARL, TINY_MODEL
from tests.integration.redis_answers import answering_redis, loading_redis, outside_address
from workers.exits import gave_up

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    input: str
    """What the user met, as the table shows it."""
    answer: str
    """What the Redis answers (`answering_redis`)."""
    command: Callable[[Path, str], list[str]]
    """The command line, given the test's directory and the Redis URL."""
    exit_code: int
    in_process: bool = False
    """Met by the same code in this process, rather than by starting the command (seconds
    each): the rows whose command another row starts, meeting another answer."""


def _config(tmp: Path, url: str) -> str:
    path = tmp / "answers.yaml"
    redis = {"url": url, "connect_deadline_s": 1}
    tree = {"run_id": "answers", "run_dir": str(tmp / "run"), "model": TINY_MODEL, "redis": redis}
    path.write_text(yaml.safe_dump(tree | {"broker": {"port": 40000}}))
    return str(path)


def _run(tmp: Path, url: str) -> list[str]:
    return [*LLAMARL, "run", _config(tmp, url)]


def _monitor(tmp: Path, url: str) -> list[str]:
    return [*LLAMARL, "monitor", "--config", _config(tmp, url), "--once"]


def _worker(role: str, *environ: str) -> Callable[[Path, str], list[str]]:
    """`llamarl worker ROLE` as worker w0, under `environ` (NAME=value)."""

    def command(tmp: Path, url: str) -> list[str]:
        return ["env", *environ, *LLAMARL, "worker", role, "--config", _config(tmp, url), "--worker-id", "w0"]

    command.role = role  # type: ignore[attr-defined]
    return command


CASES = [
    Case("a Redis in protected mode (llamarl run)", "DENIED", _run, 2),
    Case("a Redis in protected mode (worker reward)", "DENIED", _worker("reward"), 2),
    Case("a Redis in protected mode (worker generator)", "DENIED", _worker("generator"), 2, in_process=True),
    Case("a Redis in protected mode (worker trainer)", "DENIED", _worker("trainer"), 2, in_process=True),
    Case("a Redis in protected mode (trainer rank 1)", "DENIED", _worker("trainer", "RANK=1", "WORLD_SIZE=2"), 2),
    Case("a Redis in protected mode (llamarl monitor)", "DENIED", _monitor, 2),
    Case("a Redis password missing from redis.url (llamarl run)", "NOAUTH", _run, 2, in_process=True),
    Case("a Redis password missing from redis.url (worker)", "NOAUTH", _worker("reward"), 2, in_process=True),
    Case("a wrong Redis password (llamarl run)", "WRONGPASS", _run, 2, in_process=True),
    Case("a wrong Redis password (worker)", "WRONGPASS", _worker("reward"), 2, in_process=True),
    Case("a read-only Redis replica (llamarl run)", "READONLY", _run, 2, in_process=True),
    Case("a read-only Redis replica (worker)", "READONLY", _worker("reward"), 2),
    Case("a Redis out of memory (llamarl run)", "OOM", _run, 1),
    Case("a Redis out of memory (worker)", "OOM", _worker("reward"), 3),
    Case("a Redis still loading its data (llamarl run)", "LOADING", _run, 1, in_process=True),
    Case("a Redis still loading its data (worker)", "LOADING", _worker("reward"), 3, in_process=True),
    Case("a Redis still loading its data (llamarl monitor)", "LOADING", _monitor, 3),
]


def _started(case: Case, tmp: Path, url: str) -> tuple[int, str]:
    """The exit code and stderr of the case's command."""
    proc = supervise.start(case.command(tmp, url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        _, err = proc.communicate(timeout=120)  # a hang guard, not a speed bound
    finally:
        supervise.stop(proc)
    return proc.returncode, err


def _met_here(case: Case, tmp: Path, url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit code and line of the case's command, from the code it runs first on the Redis:
    the launcher's look at it (`run_finished`), a worker's (`worker_finished`, then `gave_up`)."""
    config = load_config(_config(tmp, url))
    if case.command is _run:
        try:
            run_finished(config, resume=False)
        except ConfigError as err:
            return 2, f"config error: {err}"
        except ConnectionError as err:
            return 1, f"run failed: {err}"
    else:
        role = case.command.role  # type: ignore[attr-defined]
        try:
            worker_finished(role, "w0", config)
        except (ConfigError, ConnectionError) as err:
            capsys.readouterr()
            code = gave_up(role, "w0", err)
            return code, capsys.readouterr().err
    raise AssertionError(f"{case.input}: the Redis served it")


@pytest.mark.parametrize("case", CASES, ids=[c.input for c in CASES])
def test_a_redis_answer_is_one_line_and_an_exit_code(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with answering_redis(case.answer, tmp_path / "redis") as url:
        code, err = _met_here(case, tmp_path, url, capsys) if case.in_process else _started(case, tmp_path, url)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert code == case.exit_code, err[-2000:]
    assert len(lines) == 1, f"expected one line, got: {lines}"
    assert "Traceback" not in err
    message = lines[0].replace(str(tmp_path), "TMP")
    if case.answer == "DENIED":
        message = message.replace(outside_address(), "HOST")
    message = re.sub(r"\b\d{5}\b", "PORT", message)
    row = f"| {case.input} | `` {message} `` | {case.exit_code} |"
    assert row in (REPO / "docs" / "operations.md").read_text(), f"the bad-input table lacks:\n{row}"


MISCONF = b"-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.\r\n"
"""What a Redis whose snapshots fail answers a write (redis-server's own words)."""


def test_refusals_a_worker_meets_later_are_named_too(tmp_path: Path) -> None:
    """An ACL user not allowed a script (NOPERM), writes refused while snapshots fail (MISCONF)
    or the primary is down (MASTERDOWN): each a one-line error of its kind from the store every
    worker goes through. NOPERM from a real Redis, the others from a socket server speaking RESP
    (a real Redis needs a failing disk or a cluster to say them)."""
    server = RedisServer(tmp_path / "acl").start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@read", "+ping"])
        admin.close()
        limited = f"redis://reader:pw@127.0.0.1:{server.port}/0"
        with pytest.raises(ConfigError, match=r"^redis.url redis://reader:\*\*\*@.*\(NOPERM: the ACL\)"):
            RedisStore(limited, "answers", connect_deadline_s=2).end_tickets([(0, "trained")])
    finally:
        server.stop()
    for answer, shown in ((MISCONF, "MISCONF Redis is configured"), (b"-MASTERDOWN Link with MASTER is down\r\n", "")):
        with loading_redis(answer) as url:
            with pytest.raises(RedisUnavailableError, match=f"Redis refuses writes for now \\({shown}"):
                RedisStore(url, "answers", connect_deadline_s=2).run_status()
