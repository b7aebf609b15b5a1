"""The OpenAI-compatible HTTP endpoint (FastAPI): `POST /v1/chat/completions`,
`POST /v1/completions` and `GET /v1/models`, each for a live episode's key only.

A chat request with `stream: true` is answered as server-sent events (`llamarl.agents.streaming`).
A request is refused here, before it reaches the model, when its key is not a live episode's
(401: forged, or its episode is over), its episode has `max_concurrent_per_episode` requests in
flight or all episodes `max_concurrent` (429), its body is over `max_request_bytes` (413), takes
over `body_timeout_s` (408), not JSON, or not a body the API defines (400, naming the field; an
unknown field too). Each refusal is counted by reason (`on_reject`) and answered in the OpenAI
error form; none reaches the model or the worker. A client that leaves during its upload or before its answer is counted
(`upload_abandoned`, `client_gone`), not logged. An accepted request waits in `inbox` for the
episode runner (`llamarl.agents.runner`), which samples it with the others and answers it.

The routes find the endpoint through their request (`app.state.endpoint`), so no module's state
leads to it or its episodes' keys (`llamarl.agents.isolation`).
"""

from __future__ import annotations

import asyncio
import json
import queue
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from llamarl.agents.record import AgentEpisode
from llamarl.agents.responses import error_body
from llamarl.agents.streaming import chat_events
from llamarl.agents.wire import ChatRequest, CompletionRequest, problem
from llamarl.config.endpoint import EndpointConfig
from llamarl.limits import RejectHook

Answer = tuple[int, dict[str, Any]]
"""(HTTP status, JSON body)."""


@dataclass
class Waiting:
    """An accepted request, until the runner answers it."""

    episode: AgentEpisode
    body: ChatRequest | CompletionRequest
    answer: Future[Answer] = field(default_factory=Future)
    context: list[int] = field(default_factory=list)
    """The token ids it is sampled from (set by the runner)."""
    budget: int = 0
    """The most tokens it may sample (set by the runner)."""


class Endpoint:
    def __init__(
        self,
        model: str,
        version: Callable[[], int],
        limits: EndpointConfig,
        inbox: queue.Queue[Any],
        on_reject: RejectHook,
        answer_timeout_s: float,
    ) -> None:
        self.model = model
        self.answer_timeout_s = answer_timeout_s
        """The longest a request waits for its answer (an episode's time, then it is over)."""
        self.version = version
        self.limits = limits
        self.inbox = inbox
        self.on_reject = on_reject
        self.live: dict[str, AgentEpisode] = {}
        self.lock = threading.Lock()
        self.active = 0
        """Requests being served (on the server's one event loop)."""
        self.in_flight: dict[str, int] = {}
        """Requests being served, by episode id."""

    def open(self, episode: AgentEpisode) -> None:
        with self.lock:
            self.live[episode.episode_id] = episode

    def close(self, episode: AgentEpisode) -> None:
        with self.lock:
            self.live.pop(episode.episode_id, None)

    def episode_of(self, authorization: str | None) -> AgentEpisode | None:
        """The live episode an `Authorization: Bearer ID.SECRET` header carries."""
        scheme, _, key = (authorization or "").partition(" ")
        episode_id, _, secret = key.partition(".")
        with self.lock:
            episode = self.live.get(episode_id)
        if scheme.lower() != "bearer" or episode is None:
            return None
        return episode if secrets.compare_digest(episode.secret.encode(), secret.encode()) else None

    def refuse(self, status: int, reason: str, message: str, close: bool = False) -> JSONResponse:
        """Count and answer a refusal; `close` ends the connection once answered. (A body left
        unread otherwise follows the answer, read and dropped within `header_timeout_s`: closing
        on unread bytes resets the connection, and the client may lose the answer.)"""
        self.on_reject(reason, message)
        headers = {"Connection": "close"} if close else None
        return JSONResponse(error_body(status, message), status_code=status, headers=headers)

    async def read(self, request: Request) -> bytes | None:
        """The body, or None when it is over the size bound."""
        cap = self.limits.max_request_bytes
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > cap:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def serve(self, request: Request, kind: type[BaseModel]) -> Response:
        episode = self.episode_of(request.headers.get("authorization"))
        if episode is None:
            return self.refuse(401, "episode_key", "the API key is no live episode's")
        own = self.in_flight.get(episode.episode_id, 0)
        if own >= self.limits.max_concurrent_per_episode:
            message = f"over {self.limits.max_concurrent_per_episode} requests at once an episode"
            return self.refuse(429, "episode_concurrent", message)
        if self.active >= self.limits.max_concurrent:
            return self.refuse(429, "endpoint_busy", "too many requests at once; retry later")
        self.active += 1
        self.in_flight[episode.episode_id] = own + 1
        try:
            return await self._serve(request, kind, episode)
        finally:
            self.active -= 1
            self.in_flight[episode.episode_id] -= 1
            if not self.in_flight[episode.episode_id]:
                del self.in_flight[episode.episode_id]

    async def _serve(self, request: Request, kind: type[BaseModel], episode: AgentEpisode) -> Response:
        try:
            body = await asyncio.wait_for(self.read(request), self.limits.body_timeout_s)
        except asyncio.TimeoutError:
            return self.refuse(408, "body_timeout", f"the body took over {self.limits.body_timeout_s} s", close=True)
        except ClientDisconnect:
            return self.refuse(400, "upload_abandoned", "the client left before the body's end")
        if body is None:
            message = f"the body is over {self.limits.max_request_bytes} bytes"
            return self.refuse(413, "request_too_large", message)
        try:
            parsed = kind.model_validate(json.loads(body))
        except (ValueError, RecursionError) as err:  # RecursionError: JSON nested too deep
            detail = problem(err) if isinstance(err, ValidationError) else "not JSON"
            return self.refuse(400, "bad_request", f"the request body: {detail}")
        assert isinstance(parsed, ChatRequest | CompletionRequest)
        waiting = Waiting(episode, parsed)
        self.inbox.put(waiting)
        answered: Answer | None = None
        try:
            answered = await asyncio.wait_for(asyncio.wrap_future(waiting.answer), self.answer_timeout_s)
        except asyncio.TimeoutError:
            pass
        if await request.is_disconnected():
            return self.refuse(499, "client_gone", "the client left before its answer")
        if answered is None:
            return self.refuse(504, "unanswered", "the episode ended before an answer")
        status, answer = answered
        if status == 200 and isinstance(parsed, ChatRequest) and parsed.stream:
            usage = bool((parsed.stream_options or {}).get("include_usage"))
            return StreamingResponse(chat_events(answer, usage), media_type="text/event-stream")
        return JSONResponse(answer, status_code=status)

    def app(self) -> FastAPI:
        """The HTTP app; it keeps this endpoint in `app.state.endpoint`."""
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        app.state.endpoint = self
        app.add_exception_handler(HTTPException, _unknown_route)
        app.add_api_route("/v1/models", _models, methods=["GET"])
        app.add_api_route("/v1/chat/completions", _chat, methods=["POST"])
        app.add_api_route("/v1/completions", _completions, methods=["POST"])
        return app


def _endpoint(request: Request) -> Endpoint:
    endpoint: Endpoint = request.app.state.endpoint
    return endpoint


async def _unknown_route(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, HTTPException)  # the only kind it is registered for
    return _endpoint(request).refuse(err.status_code, "unknown_route", f"{request.url.path}: {err.detail}")


async def _models(request: Request) -> JSONResponse:
    endpoint = _endpoint(request)
    if endpoint.episode_of(request.headers.get("authorization")) is None:
        return endpoint.refuse(401, "episode_key", "the API key is no live episode's")
    entry = {
        "id": endpoint.model,
        "object": "model",
        "created": 0,
        "owned_by": "llamarl",
        "policy_version": endpoint.version(),
    }
    return JSONResponse({"object": "list", "data": [entry]})


async def _chat(request: Request) -> Response:
    return await _endpoint(request).serve(request, ChatRequest)


async def _completions(request: Request) -> Response:
    return await _endpoint(request).serve(request, CompletionRequest)
