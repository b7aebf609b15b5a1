"""A cluster whose roles are started by hand with `llamarl worker`, as on separate machines:
Redis and the broker from the embedded services, one trainer, two generators, one reward worker,
each logging to `run_dir/logs/<worker id>.log`."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from brokers.embedded import EmbeddedServices
from llamarl.store import RedisStore
from tests.integration.async_helpers import worker_argv, write_config

ROLES = {"trainer": "trainer", "generator-0": "generator", "generator-1": "generator", "reward-0": "reward"}


class HandCluster:
    """The services, the four worker processes and a store client on the run's keys."""

    def __init__(self, tmp_path: Path, run_id: str, **sections: Any) -> None:
        self.config = write_config(tmp_path, run_id, **sections)
        self.run_dir = tmp_path / run_id
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True)
        self.services = EmbeddedServices(self.run_dir, run_id).start()
        self.env = {**os.environ, **self.services.env()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for worker_id in ROLES:
            self.start(worker_id)
        self.store = RedisStore(self.services.redis_url, run_id)

    def start(self, worker_id: str) -> subprocess.Popen[bytes]:
        """(Re)start `worker_id` with the command a user types on its machine."""
        with open(self.logs / f"{worker_id}.log", "ab") as log:
            proc = subprocess.Popen(
                worker_argv(ROLES[worker_id], worker_id, self.config),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[worker_id] = proc
        return proc

    def kill(self, worker_id: str) -> None:
        """SIGKILL `worker_id` and wait for it to be gone."""
        proc = self.procs[worker_id]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def close(self) -> None:
        """Kill what still runs (by the pids started here), then the services."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        self.store.close()
        self.services.stop()
