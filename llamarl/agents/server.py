"""The endpoint's HTTP server: uvicorn on its own thread and event loop, on a socket bound
before it starts (so a port that is taken is a configuration error at start, and port 0 gets a
free one whose number the agents are handed). Its connections are held to the endpoint's limits
(`llamarl.agents.connections`); it leaves logging as the process configured it."""

from __future__ import annotations

import socket
import time
from typing import cast

import uvicorn
from fastapi import FastAPI

from llamarl.agents.connections import guarded
from llamarl.agents.endpoint import Endpoint
from llamarl.agents.isolation import PrivateThread
from llamarl.errors import ConfigError
from llamarl.net import address_family

START_TIMEOUT_S = 30.0


class ServerThread:
    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        """Serve `app` (an `Endpoint.app()`, whose limits and refusal counter it takes)."""
        try:
            self.socket = socket.create_server((host, port), family=address_family(host))
        except OSError as err:
            raise ConfigError(
                f"generation.openai: cannot listen on {host}:{port} ({err.strerror}); pick a free port, or 0 for any"
            ) from None
        self.port = int(self.socket.getsockname()[1])
        loopback = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        shown = f"[{loopback}]" if ":" in loopback else loopback
        self.base_url = f"http://{shown}:{self.port}/v1"
        """Where an agent's client sends its requests."""
        endpoint: Endpoint = app.state.endpoint
        config = uvicorn.Config(
            app,
            http=guarded(endpoint.limits, endpoint.on_reject),
            timeout_keep_alive=cast(int, endpoint.limits.idle_timeout_s),  # typed int, used as a float
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        sockets = [self.socket]
        self.thread = PrivateThread(lambda: self.server.run(sockets=sockets), name="openai-endpoint")

    def start(self) -> None:
        """Serve from now on; RuntimeError when the server does not come up."""
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI endpoint did not start on {self.base_url}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.socket.close()
