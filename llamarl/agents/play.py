"""Your agent function, run once an episode: imported and checked before anything starts, then
called on a thread and event loop of its own with the prompt row and an `openai.AsyncOpenAI`
client pointed at the endpoint with the episode's key. A thread each, so an agent that blocks
(not only one that awaits forever) holds up no other: one past its time is left behind on its
daemon thread, and its episode is ended without it."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable
from typing import Any

from llamarl.agents.isolation import PrivateThread, client, prepare_client
from llamarl.errors import ConfigError
from llamarl.protocol import trainable_reward
from llamarl.tasks import Example
from llamarl.user_code import load_named

Agent = Callable[[dict[str, Any], Any], Any]
"""async (row, client) -> reward or None."""
Done = Callable[[float | None, str | None, bool], None]
"""Told the agent's reward (None: none given) or its error, and whether the agent was lost
(`AgentLost`)."""


class AgentLost(Exception):
    """The agent's process could not be reached or went away mid-episode (an agent server,
    `llamarl.agents.remote`): its episode is handed out again, not ended."""


def agent_function(spec: str) -> Agent:
    """The async function `environment.agent` names; ConfigError when it is not one."""
    function = load_named(spec, "environment.agent")
    if not inspect.iscoroutinefunction(function):
        raise ConfigError(
            f"environment.agent {spec}: not an async function; write `async def "
            f"{spec.partition(':')[2]}(row, client)` (docs/environments.md)"
        )
    return function


def row_of(example: Example) -> dict[str, Any]:
    """What the agent is given: the data row, with the prompt, answer and chat messages."""
    row = {**example.row, "prompt": example.prompt, "answer": example.answer}
    if example.messages:
        row["messages"] = [dict(m) for m in example.messages]
    return row


def reward_of(value: Any) -> float | None:
    """The agent's return value as a reward; TypeError for anything but a number or None,
    ValueError for a number the trainer cannot hold (past float32's range: 1e300, inf, NaN)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"the agent returned {type(value).__name__}, not a finite number or None")
    if not trainable_reward(value):
        raise ValueError(f"the agent returned {value!r:.40}, not a number finite as float32 (rewards train as float32)")
    return float(value)


async def _play(agent: Agent, row: dict[str, Any], base_url: str, key: str, timeout_s: float) -> Any:
    async with client(base_url, key, timeout_s) as own:
        return await asyncio.wait_for(agent(row, own), timeout_s)


def play_once(agent: Agent, row: dict[str, Any], base_url: str, key: str, timeout_s: float) -> Any:
    """Run one episode's agent to its end on an event loop of its own; what it returned."""
    return asyncio.run(_play(agent, row, base_url, key, timeout_s))


class AgentThreads:
    """Daemon threads that run agents, each reused once its agent is over (starting a thread
    takes milliseconds on a loaded machine); a new one starts only when none is idle, so an
    agent that blocks its thread for good costs that one thread and holds up no other. The
    client is made ready before any agent runs (`llamarl.agents.isolation`)."""

    def __init__(self) -> None:
        try:
            prepare_client()
        except ImportError as err:
            raise ConfigError(f"environment.agent: the agents' client needs {err.name}: pip install openai") from None
        except Exception as err:  # the client could not talk to a server on this host
            raise ConfigError(
                f"environment.agent: the agents' client could not reach a loopback server ({type(err).__name__}: "
                f"{str(err)[:120]}); a proxy in HTTP_PROXY needs NO_PROXY=127.0.0.1,localhost"
            ) from None
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()

    def _work(self) -> None:
        while True:
            self.jobs.get()()
            with self.lock:
                self.idle += 1

    def start(
        self,
        agent: Agent,
        row: dict[str, Any],
        base_url: str,
        key: str,
        timeout_s: float,
        done: Done,
    ) -> None:
        """Run one episode's agent; `done` is told how it ended."""

        def run() -> None:
            try:
                value = reward_of(play_once(agent, row, base_url, key, timeout_s))
            except AgentLost as err:
                done(None, f"lost: {err}"[:300], True)
                return
            except BaseException as err:  # the agent's own failure (cancelled too): its end
                done(None, f"{type(err).__name__}: {err}"[:300], False)
                return
            done(value, None, False)

        with self.lock:
            spare = self.idle > 0
            self.idle -= spare
        if not spare:
            PrivateThread(self._work, name="agent").start()
        self.jobs.put(run)
