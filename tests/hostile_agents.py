"""Hostile agents for the endpoint's limits, importable as `tests.hostile_agents:name` like a
user's. They speak HTTP over raw sockets, and this module imports no HTTP library at its top:
`lazy_import` imports `httpx` on its own thread while other episodes' clients are busy.

Its `main(N)`, run in a fresh interpreter, plays N `lazy_import` episodes, then `key_hunt` ones,
and prints, as JSON, how each ended, which modules of the client's transport were first imported
while the agents ran, and which paths lead from module state to another episode's key."""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import re
import sys
import threading
import types
import warnings
from collections import deque
from typing import Any
from urllib.parse import urlsplit

NUM_UPLOADS = 16
"""The slow uploads the attacker opens, each with its own connection."""
UPLOADS: list[str] = []
"""The first status line each of the attacker's uploads was answered with."""
HELD: list[str] = []
"""What each upload the endpoint began reading (a `100 Continue`) was answered in the end."""
ATTACKING = threading.Event()
"""Set once every upload has been answered 100 Continue (its body is being read) or refused."""
STOP = threading.Event()
"""Set by the well-behaved episode when its request failed: the attacker gives up."""
GOOD: dict[str, Any] = {}
"""The well-behaved episode's answer: `status`, and `held_open` (how many of the attacker's held
uploads were still unanswered when its answer came)."""
IMPORTED = threading.Event()
"""Set by `lazy_import` once its `import httpx` is over."""


def _head(base_url: str, key: str, length: int) -> tuple[str, int, bytes]:
    """Where to connect, and the headers of a chat request with `key` that waits for a
    `100 Continue` (sent once the endpoint begins reading its body)."""
    url = urlsplit(f"{base_url}chat/completions")
    lines = [f"POST {url.path} HTTP/1.1", f"Host: {url.netloc}", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", "Expect: 100-continue", f"Authorization: Bearer {key}"]
    return url.hostname or "", url.port or 80, ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _status(reader: asyncio.StreamReader) -> str:
    """The next status line read ("" at the end of the connection); other lines are skipped."""
    while True:
        line = (await reader.readline()).decode()
        if not line or line.startswith("HTTP/"):
            return line.strip()


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> str:
    """Send `body` a byte every 50 ms until the upload is answered; its final status line."""
    for byte in body:
        if STOP.is_set():
            break
        try:
            return await asyncio.wait_for(_status(reader), 0.05)
        except asyncio.TimeoutError:
            writer.write(bytes([byte]))
    return "abandoned"


async def _upload(base_url: str, key: str) -> None:
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "1" * 400}]}).encode()
    host, port, head = _head(base_url, key, len(body))
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head)
    first = await _status(reader)
    UPLOADS.append(first)
    if " 100 " in f"{first} ":
        slot = len(HELD)
        HELD.append("open")
        HELD[slot] = await _trickle(reader, writer, body)
    writer.close()


async def slow_uploads(row: dict[str, Any], client: Any) -> None:
    """Episode 0 opens NUM_UPLOADS uploads with its key and sends their bodies a byte at a time;
    episode 1 waits until those are being read (or refused), then asks one ordinary request."""
    base_url, key = str(client.base_url), client.api_key
    if row["a"] == 0:
        uploads = [asyncio.ensure_future(_upload(base_url, key)) for _ in range(NUM_UPLOADS)]
        while len(UPLOADS) < NUM_UPLOADS and not all(u.done() for u in uploads):
            await asyncio.wait(uploads, timeout=0.01)
        ATTACKING.set()
        await asyncio.gather(*uploads)
        return
    await asyncio.to_thread(ATTACKING.wait, 60)
    try:
        await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=3
        )
        GOOD.update(status=200, held_open=HELD.count("open"))
    except Exception as err:
        GOOD.update(status=getattr(err, "status_code", type(err).__name__), held_open=HELD.count("open"))
        STOP.set()


async def lazy_import(row: dict[str, Any], client: Any) -> float:
    """Episode 0 imports `httpx` on its own thread after its first answer; every other episode
    asks requests until that import is over, and two more."""
    message = [{"role": "user", "content": row["prompt"]}]
    await client.chat.completions.create(model="p", messages=message, max_tokens=2)
    if row["a"] == 0:
        importlib.import_module("httpx")
        IMPORTED.set()
        return 1.0
    more = 2
    while more:
        await client.chat.completions.create(model="p", messages=message, max_tokens=2)
        more -= IMPORTED.is_set()
    return 1.0


TRANSPORT = ("openai", "httpx", "httpx2", "httpcore", "anyio", "h11", "sniffio", "certifi", "idna")


def _transport_modules() -> set[str]:
    return {name for name in sys.modules if name.partition(".")[0] in TRANSPORT}


def _play(agent: str, num_episodes: int, **environment: Any) -> tuple[list[list[str]], list[str]]:
    """Play `num_episodes` episodes of `agent` on a runner of its own: how each ended, and the
    client's modules first imported once the runner was made."""
    import torch

    from llamarl.agents.runner import AgentRunner
    from llamarl.config import EnvironmentConfig, ModelConfig
    from llamarl.config.endpoint import EndpointConfig
    from llamarl.engine.episodes import Sampling
    from llamarl.engine.model import build_policy
    from llamarl.tasks import Example

    policy = build_policy(ModelConfig(), seed=0)
    config = EnvironmentConfig(kind="agent", agent=f"tests.hostile_agents:{agent}", **environment)
    runner = AgentRunner(policy, config, EndpointConfig(max_choices=1), "built")
    examples = [Example(i, f"{i}+1=", str(i + 1), row={"a": i}) for i in range(num_episodes)]
    sampling = Sampling(2, generator=torch.Generator().manual_seed(0))
    before = _transport_modules()
    try:
        episodes = runner.run(examples, 1, sampling, lambda: 0)
    finally:
        runner.close()
    return [[e.end or "", (e.error or "")[:200]] for e in episodes], sorted(_transport_modules() - before)


def main(num_episodes: int) -> None:
    """Play `lazy_import` episodes, then `key_hunt` ones; print, as JSON, how they ended, the
    client's modules first imported while agents ran, and the paths the hunt found."""
    ends, imported_late = _play("lazy_import", num_episodes, max_requests=10_000)
    hunt, _ = _play("key_hunt", 3, episode_timeout_s=600)
    print(json.dumps({"ends": ends, "imported_late": imported_late, "hunt": hunt, "key_paths": FOUND}))


KEY = re.compile(r"^[0-9a-f]{16}\.[A-Za-z0-9_-]{32}$")
UNWALKED = (types.FrameType, types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)
FOUND: list[str] = []
"""The paths `key_hunt` found from module state to another episode's key or record."""
HUNTED = threading.Event()


def _paths_to_keys(own: str) -> list[str]:
    """Paths from every module's state (not threads' frames, coroutines or the collector's list
    of every object) to another episode's record (`AgentEpisode`) or key."""
    came_from: dict[int, tuple[int, str]] = {}
    """id -> (the id it was reached from, its type's name)."""
    queue: deque[Any] = deque()
    for name, module in list(sys.modules.items()):
        if module is not None and id(module) not in came_from:
            came_from[id(module)] = (0, f"module {name}")
            queue.append(module)
    found = []
    while queue:
        obj = queue.popleft()
        if type(obj).__name__ == "AgentEpisode" or (isinstance(obj, str) and KEY.match(obj) and obj != own):
            found.append(_path(came_from, id(obj)))
            continue
        if isinstance(obj, (str, bytes, int, float, *UNWALKED)):
            continue
        for ref in gc.get_referents(obj):
            if id(ref) not in came_from:
                came_from[id(ref)] = (id(obj), type(ref).__name__)
                queue.append(ref)
    return found


def _path(came_from: dict[int, tuple[int, str]], at: int) -> str:
    steps = []
    while at:
        at, name = came_from[at]
        steps.append(name)
    return " > ".join(reversed(steps))


async def key_hunt(row: dict[str, Any], client: Any) -> None:
    """Episode 0 walks module state for other episodes' keys while the others wait."""
    if row["a"] == 0:
        with warnings.catch_warnings():  # reading some modules' attributes warns
            warnings.simplefilter("ignore")
            FOUND.extend(_paths_to_keys(client.api_key))
        HUNTED.set()
    else:
        await asyncio.to_thread(HUNTED.wait, 600)
