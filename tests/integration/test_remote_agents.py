"""Agents on an agent server (`environment.agent_url`, `llamarl agent serve`): a real server
process on loopback plays the episodes a runner hands it over HTTP, with the official `openai`
client, exactly as in process; one killed mid-episode loses it, and the episode is handed out
again under a new key to the server started in its place, its old key refused from then on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

from llamarl.agents.remote import AGENT_TOKEN
from llamarl.agents.runner import AgentRunner
from llamarl.config import EnvironmentConfig, ModelConfig
from llamarl.config.endpoint import EndpointConfig
from llamarl.engine.episodes import Episode, Sampling
from llamarl.engine.model import build_policy
from llamarl.engine.turns import TurnRenderer
from tests.integration.test_agent_endpoint import EXTRA, examples

TOKEN = "a-test-secret-of-32-characters!!"


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(agent: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "workers.cli", "agent", "serve", "--agent", f"tests.user_agents:{agent}"]
    proc = subprocess.Popen([*command, "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: _listening(port) or proc.poll() is not None, 60) and proc.poll() is None
    return proc


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _runner(port: int, counted: Counter[str]) -> AgentRunner:
    policy = build_policy(ModelConfig(extra_characters=EXTRA), seed=0)
    config = EnvironmentConfig(kind="agent", agent_url=f"http://127.0.0.1:{port}", max_reissues=8)

    def count(name: str, amount: float) -> None:
        counted[name] += int(amount)

    return AgentRunner(
        policy, config, EndpointConfig(), "built", on_reject=lambda r, d: counted.update([r]), count=count
    )


def test_an_agent_server_plays_episodes_as_an_agent_in_process_does(
    servers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AGENT_TOKEN, TOKEN)
    port = _free_port()
    servers.append(_serve("three_turns", port, os.environ | {AGENT_TOKEN: TOKEN}))
    counted: Counter[str] = Counter()
    run = _runner(port, counted)
    try:
        episodes = run.run(examples(2), 2, Sampling(6, generator=torch.Generator().manual_seed(0)), lambda: 3)
    finally:
        run.close()
    reply = TurnRenderer(run.policy).text_ids("+1 ")
    for episode in episodes:
        assert episode.end == "done" and episode.num_model_turns == 3, (episode.end, episode.error)
        assert [t for t, v in zip(episode.tokens, episode.versions, strict=True) if v < 0] == reply * 2
        assert episode.reward == float(episode.example.row["a"] % 2)
    assert not counted.get("agent_episodes_reissued")
    # Without the secret the server plays nothing.
    refused = httpx.post(f"http://127.0.0.1:{port}/episodes", json={}, headers={"Authorization": "Bearer guess"})
    assert refused.status_code == 401


def test_a_killed_agent_server_loses_its_episode_which_is_handed_out_again(
    servers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(AGENT_TOKEN, TOKEN)
    port = _free_port()
    mark = tmp_path / "asked"
    env = os.environ | {AGENT_TOKEN: TOKEN, "LLAMARL_TEST_MARK": str(mark)}
    servers.append(stalling := _serve("stalls_after_one_turn", port, env))
    counted: Counter[str] = Counter()
    run = _runner(port, counted)
    played: list[Episode] = []
    playing = threading.Thread(
        target=lambda: played.extend(run.run(examples(1), 1, Sampling(6, generator=torch.Generator()), lambda: 3))
    )
    playing.start()
    try:
        assert wait_until(mark.exists, 60), "the first agent asked for its turn"
        lost_key = mark.read_text()
        stalling.send_signal(signal.SIGKILL)
        stalling.wait(10)
        servers.append(_serve("three_turns", port, env))
        playing.join(120)
        assert not playing.is_alive()
        late = {"model": "policy", "messages": [{"role": "user", "content": "1"}]}
        refused = httpx.post(
            f"{run.server.base_url}/chat/completions", json=late, headers={"Authorization": f"Bearer {lost_key}"}
        )
        assert refused.status_code == 401, "the lost episode's key was revoked"
    finally:
        run.close()
    (episode,) = played
    assert episode.end == "done" and episode.num_model_turns == 3, (episode.end, episode.error)
    assert counted["agent_episodes_reissued"] >= 1
