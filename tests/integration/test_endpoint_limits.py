"""The endpoint against a hostile agent on the HTTP side, over real sockets: one episode's slow
uploads leave another episode served, idle and slowloris connections are closed within their
timeouts, a full connection table closes its longest-idle connection for a new one, abandoned
uploads and clients gone before their answer are counted and log no traceback; and, in an
interpreter of their own, an agent that imports `httpx` on its own thread breaks no other
episode, and one that walks module state finds no other episode's key."""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch

from llamarl.agents.record import AgentEpisode
from llamarl.agents.runner import AgentRunner
from llamarl.config import EnvironmentConfig, ModelConfig
from llamarl.config.endpoint import EndpointConfig
from llamarl.engine.episodes import Sampling
from llamarl.engine.model import build_policy
from llamarl.tasks import Example
from tests import hostile_agents

REPO = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture
def rejected() -> Counter[str]:
    return Counter()


@pytest.fixture
def made() -> Iterator[list[AgentRunner]]:
    runners: list[AgentRunner] = []
    for kept in (hostile_agents.UPLOADS, hostile_agents.HELD, hostile_agents.GOOD):
        kept.clear()
    hostile_agents.ATTACKING.clear()
    hostile_agents.STOP.clear()
    yield runners
    hostile_agents.STOP.set()
    for each in runners:
        each.close()


def runner(rejected: Counter[str], episode_timeout_s: float = 60, **limits: Any) -> AgentRunner:
    policy = build_policy(ModelConfig(), seed=0)
    config = EnvironmentConfig(
        kind="agent", agent="tests.hostile_agents:slow_uploads", episode_timeout_s=episode_timeout_s
    )
    endpoint = EndpointConfig(max_request_bytes=100_000, **limits)

    def count(reason: str, detail: str) -> None:
        rejected.update([reason])

    return AgentRunner(policy, config, endpoint, "built", on_reject=count)


def examples(count: int) -> list[Example]:
    return [Example(i, f"{i}+1=", str(i + 1), row={"a": i}) for i in range(count)]


def connect(run: AgentRunner) -> socket.socket:
    url = urlsplit(run.server.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def live_key(run: AgentRunner) -> str:
    episode = AgentEpisode(examples(1)[0])
    run.endpoint.open(episode)
    return episode.key


def get_models(sock: socket.socket, key: str) -> str:
    """GET /v1/models on `sock` (kept open); the status line."""
    sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    top, _, body = head.partition(b"\r\n\r\n")
    length = int(next(line for line in top.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1])
    while len(body) < length:
        body += sock.recv(4096)
    return top.split(b"\r\n")[0].decode()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (it is readable and reads end of file)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_slow_uploads_of_one_episode_leave_another_episode_served(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    """Episode 0 sends 16 uploads a byte every 50 ms (22 s a body) against 8 slots; episode 1's
    request, sent once all 16 are being read or refused, is answered while the 4 the endpoint
    reads are still open (before their body timeout), which then answers them 408."""
    made.append(run := runner(rejected, max_concurrent=8, max_concurrent_per_episode=4, body_timeout_s=8))
    sampling = Sampling(3, generator=torch.Generator().manual_seed(0))
    attacker, good = run.run(examples(2), 1, sampling, lambda: 0)
    assert hostile_agents.GOOD == {"status": 200, "held_open": 4}, hostile_agents.GOOD
    assert good.end == "done" and good.num_model_turns == 1
    assert Counter(hostile_agents.UPLOADS) == {"HTTP/1.1 100 Continue": 4, "HTTP/1.1 429 Too Many Requests": 12}
    assert hostile_agents.HELD == ["HTTP/1.1 408 Request Timeout"] * 4
    assert attacker.end == "done"
    assert rejected == {"episode_concurrent": 12, "body_timeout": 4}


def test_idle_and_slowloris_connections_are_closed_within_their_timeouts(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    """Idle connections; connections sending a request's headers a byte every 0.2 s; and
    connections sending a refused request's body (no key: 401) a byte every 0.2 s."""
    made.append(run := runner(rejected, idle_timeout_s=1, header_timeout_s=2))
    # When each connected (idle) or began to send, read just before it did: read after, a pause
    # of this process in between would make the server's timeout look short.
    started: dict[socket.socket, float] = {}
    for _ in range(30):
        began = time.monotonic()
        started[connect(run)] = began
    slow = [connect(run) for _ in range(15)]
    for n, sock in enumerate(slow):
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        started[sock] = time.monotonic()
        sock.sendall((head + ("Content-Length: 9000\r\n\r\n{" if n >= 10 else "X-Slow: ")).encode())
    closed: dict[socket.socket, float] = {}
    deadline = time.monotonic() + 20
    while len(closed) < 45 and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in started if s not in closed], [], [], 0.2)
        for sock in readable:
            if closed_by_server(sock):
                closed[sock] = time.monotonic() - started[sock]
        for sock in set(slow) - set(closed):
            try:
                sock.sendall(b"x")  # a byte every 0.2 s: never idle, never done
            except OSError:
                closed[sock] = time.monotonic() - started[sock]
    assert len(closed) == 45, f"{45 - len(closed)} of 45 connections still open after 20 s"
    assert all(1 <= closed[s] < 10 for s in started if s not in slow), sorted(closed.values())
    assert all(2 <= closed[s] < 10 for s in slow), sorted(closed[s] for s in slow)
    assert rejected == {"header_timeout": 15, "episode_key": 5}
    for sock in started:
        sock.close()


def test_a_connection_past_the_cap_closes_the_longest_idle_one(made: list[AgentRunner], rejected: Counter[str]) -> None:
    made.append(run := runner(rejected, max_concurrent=4, max_connections=8, idle_timeout_s=60))
    key = live_key(run)
    kept = [connect(run) for _ in range(8)]
    for sock in kept:  # each answered once, then idle: the first one idle longest
        assert get_models(sock, key) == "HTTP/1.1 200 OK"
    newest = connect(run)
    assert get_models(newest, key) == "HTTP/1.1 200 OK"
    readable, _, _ = select.select([kept[0]], [], [], 10)
    assert readable and closed_by_server(kept[0])
    assert rejected == {"connection_evicted": 1}
    assert select.select(kept[1:], [], [], 0)[0] == []  # the others are open and unread
    for sock in [*kept, newest]:
        sock.close()


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_abandoned_uploads_and_gone_clients_are_counted_and_log_no_traceback(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    made.append(run := runner(rejected, episode_timeout_s=1))
    logged = Records()
    logging.getLogger("uvicorn.error").addHandler(logged)
    try:
        key = live_key(run)
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        for _ in range(8):
            sock = connect(run)
            sock.sendall(f"{head}Content-Length: 1000\r\nExpect: 100-continue\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue")  # its body is being read
            sock.sendall(b'{"model": "p", ')
            sock.close()
        body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "1+1="}]})
        sock = connect(run)
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
        sock.close()  # gone before its answer (which never comes: no episode is being run)
        deadline = time.monotonic() + 15
        while rejected != {"upload_abandoned": 8, "client_gone": 1}:
            assert time.monotonic() < deadline, (rejected, [r.getMessage() for r in logged.records])
            time.sleep(0.02)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(logged)
    assert [r.getMessage() for r in logged.records] == []


@pytest.fixture(scope="module")
def isolated() -> dict[str, Any]:
    """`tests.hostile_agents.main(8)` in a fresh interpreter (no `httpx` imported yet): its JSON."""
    played = subprocess.run(
        [sys.executable, "-c", "from tests.hostile_agents import main; main(8)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert played.returncode == 0, played.stderr[-3000:]
    result: dict[str, Any] = json.loads(played.stdout.splitlines()[-1])
    return result


def test_an_agent_importing_httpx_on_its_thread_breaks_no_other_episode(isolated: dict[str, Any]) -> None:
    """One episode's agent imports `httpx` while seven others ask request after request
    through their `openai` clients, which look `httpx` up on every request."""
    assert isolated["ends"] == [["done", ""]] * 8
    assert isolated["imported_late"] == []


def test_module_state_leads_an_agent_to_no_other_episode_key(isolated: dict[str, Any]) -> None:
    """An agent walking every module's state (not other threads' frames or the collector's
    list, which one interpreter cannot hide) finds no other episode's record or key."""
    assert isolated["hunt"] == [["done", ""]] * 3
    assert isolated["key_paths"] == []
