"""What keeps agents that share the generator's interpreter out of each other's way, and what
cannot.

Imports: a module being imported is in `sys.modules`, half made, for every thread, and the
`openai` client looks `httpx` up there on every request; so an agent whose first `import httpx`
ran beside other agents' requests failed them (`partially initialized module 'httpx'`). Before
any agent runs, `prepare_client` imports the client, `httpx` where it is installed, and whatever
they import lazily on a request (one of each kind the endpoint serves, and an error, against a
throwaway loopback server), so an agent's own imports of them find them whole.

State: no module's state leads to the endpoint, the runner or an episode's key: the endpoint's
routes find it through the request (`app.state`), and the server's and agents' threads run work
that `threading.enumerate()` does not hold (`PrivateThread`). One interpreter cannot hide more:
code that walks other threads' frames (`sys._current_frames`), the garbage collector
(`gc.get_objects`) or asyncio's tasks reaches every episode's client and key, and may patch any
module. Keys bound requests to their episode against mistakes, not against an agent written to
read them; an agent that must not, runs in a process of its own."""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import json
import ssl
import threading
from collections.abc import Callable
from typing import Any

CLIENT_MODULES = ("openai", "httpx2", "httpx")
"""The client and its transports (`httpx` where installed: `openai` reads it when loaded)."""


class PrivateThread(threading.Thread):
    """A daemon thread whose work is reachable from its own frames only: `threading` keeps every
    running thread, and a plain thread its target (and what the target holds) until it ends."""

    def __init__(self, work: Callable[[], None], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._work: Callable[[], None] | None = work

    def run(self) -> None:
        work, self._work = self._work, None
        assert work is not None
        work()


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client (a client makes its own by default, 20 ms each; the
    endpoint is plain HTTP, so it is never used, only built)."""
    return ssl.create_default_context()


def client(base_url: str, key: str, timeout_s: float) -> Any:
    """An `openai.AsyncOpenAI` for one episode: its key, no retries, `timeout_s` a request."""
    import openai

    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=key,
        max_retries=0,
        timeout=timeout_s,
        http_client=openai.DefaultAsyncHttpxClient(verify=_tls(), timeout=timeout_s),
    )


@functools.cache
def prepare_client() -> None:
    """Import the client and everything a request of it imports, once a process."""
    for name in CLIENT_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    asyncio.run(_one_request_of_each_kind())


ANSWERS: dict[str, tuple[int, dict[str, Any]]] = {
    "/v1/models": (200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]}),
    "/v1/chat/completions": (
        200,
        {
            "id": "w",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "1"},
                    "logprobs": {"content": [{"token": "1", "logprob": 0.0, "bytes": [49], "top_logprobs": []}]},
                }
            ],
        },
    ),
    "/v1/completions": (
        200,
        {
            "id": "w",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "text": "1", "finish_reason": "stop", "logprobs": None}],
        },
    ),
}


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer one request per connection from ANSWERS (anything else: 429)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next((int(h.split(":")[1]) for h in head if h.lower().startswith("content-length:")), 0)
    await reader.readexactly(length)
    path = head[0].split(" ")[1]
    status, body = ANSWERS.get(path, (429, {"error": {"message": "warm-up", "type": "x", "code": None}}))
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"Connection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    writer.close()


async def _one_request_of_each_kind() -> None:
    import openai

    server = await asyncio.start_server(_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, client(f"http://127.0.0.1:{port}/v1", "warm-up", 30) as warm:
        message = [{"role": "user", "content": "1"}]
        await warm.models.list()
        reply = await warm.chat.completions.create(model="m", messages=message, max_tokens=1, logprobs=True)
        reply.choices[0].message.model_dump(exclude_none=True)
        await warm.completions.create(model="m", prompt="1", max_tokens=1)
        try:
            await warm.models.retrieve("x")
        except openai.RateLimitError:
            pass
