"""The broker as a child process, started so that no other process can take its ports first.

With no port given, the broker binds a free block itself and writes the base port to a file
(`python -m brokers --port-file`), which is read back here; with a port (a restart where the
broker was, or one a user set), a taken port ends the broker with a config error. Either way the
caller gets the endpoints the broker really holds once it answers, or a `ServiceStartError`
with the broker's own error line.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from brokers.service_log import error_line, log_size, written_since
from llamarl.bus import query_broker_stats
from llamarl.curve import Curve
from llamarl.errors import ServiceStartError
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints

CONFIG_EXIT = 2


@dataclass
class BrokerProcess:
    process: subprocess.Popen[bytes]
    endpoints: BrokerEndpoints


def start_broker(
    env: dict[str, str],
    log_path: Path,
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    curve: Curve | None = None,
    timeout_s: float = 20.0,
) -> BrokerProcess:
    """A broker on `host` (`port`, or a free block it binds itself) that answers, its output
    appended to `log_path`. `env` is the broker's whole environment."""
    port_file = log_path.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    args = [sys.executable, "-m", "brokers", "--log-format", "json"]
    env = {**env, "LLAMARL__BROKER__HOST": host}
    env.pop("LLAMARL_BROKER", None)  # the port is the one given here, or none
    if port is None:
        args += ["--port-file", str(port_file)]
        env.pop("LLAMARL__BROKER__PORT", None)
    else:
        env["LLAMARL__BROKER__PORT"] = str(port)
    offset = log_size(log_path)
    with open(log_path, "ab") as log_file:
        process = supervise.start(args, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        endpoints = _wait_until_serving(process, log_path, offset, port, port_file, host, curve, timeout_s)
    except BaseException:
        supervise.stop(process)
        raise
    return BrokerProcess(process, endpoints)


def _wait_until_serving(
    process: subprocess.Popen[bytes],
    log_path: Path,
    offset: int,
    port: int | None,
    port_file: Path,
    host: str,
    curve: Curve | None,
    timeout_s: float,
) -> BrokerEndpoints:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            line = error_line(written_since(log_path, offset), f"exited {process.returncode}")
            raise ServiceStartError(
                "broker",
                line,
                str(log_path),
                config_error=process.returncode == CONFIG_EXIT,
                port_taken=False,
            )
        if port is None and port_file.exists():
            port = int(port_file.read_text())
            port_file.unlink()
        if port is not None:
            try:
                query_broker_stats(BrokerEndpoints(host, port), timeout_s=0.5, curve=curve)
                return BrokerEndpoints(host, port)
            except TimeoutError:
                pass
        else:
            time.sleep(0.02)
        if time.monotonic() > deadline:
            raise ServiceStartError(
                "broker",
                f"not answering after {timeout_s:g} s",
                str(log_path),
                config_error=False,
                port_taken=False,
            )
