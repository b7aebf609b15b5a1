"""The OpenAI-compatible HTTP endpoint (FastAPI): `POST /v1/chat/completions`,
`POST /v1/completions` and `GET /v1/models`, each for a live episode's key only.

A request is refused here, before it reaches the model, when the concurrency bound is full
(429), its key is not a live episode's (401: forged, or its episode is over), its body is over
`max_request_bytes` (413), not JSON, or not a body the API defines (400, naming the field; an
unknown field too). Each refusal is counted by reason (`on_reject`) and answered in the OpenAI
error form; none reaches the model or the worker. An accepted request waits in `inbox` for the
episode runner (`llamarl.agents.runner`), which samples it with the others and answers it.
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
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from llamarl.agents.record import AgentEpisode
from llamarl.agents.responses import error_body
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

    def refuse(self, status: int, reason: str, message: str) -> JSONResponse:
        self.on_reject(reason, message)
        return JSONResponse(error_body(status, message), status_code=status)

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

    async def serve(self, request: Request, kind: type[BaseModel]) -> JSONResponse:
        if self.active >= self.limits.max_concurrent:
            return self.refuse(429, "endpoint_busy", "too many requests at once; retry later")
        self.active += 1
        try:
            episode = self.episode_of(request.headers.get("authorization"))
            if episode is None:
                return self.refuse(401, "episode_key", "the API key is no live episode's")
            body = await self.read(request)
            if body is None:
                return self.refuse(
                    413,
                    "request_too_large",
                    f"the body is over {self.limits.max_request_bytes} bytes",
                )
            try:
                parsed = kind.model_validate(json.loads(body))
            except (ValueError, RecursionError) as err:  # RecursionError: JSON nested too deep
                detail = problem(err) if isinstance(err, ValidationError) else "not JSON"
                return self.refuse(400, "bad_request", f"the request body: {detail}")
            assert isinstance(parsed, ChatRequest | CompletionRequest)
            waiting = Waiting(episode, parsed)
            self.inbox.put(waiting)
            try:
                status, answer = await asyncio.wait_for(asyncio.wrap_future(waiting.answer), self.answer_timeout_s)
            except asyncio.TimeoutError:
                return self.refuse(504, "unanswered", "the episode ended before an answer")
            return JSONResponse(answer, status_code=status)
        finally:
            self.active -= 1

    def app(self) -> FastAPI:
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(HTTPException)
        async def unknown_route(request: Request, err: HTTPException) -> JSONResponse:
            return self.refuse(err.status_code, "unknown_route", f"{request.url.path}: {err.detail}")

        @app.get("/v1/models")
        async def models(request: Request) -> JSONResponse:
            if self.episode_of(request.headers.get("authorization")) is None:
                return self.refuse(401, "episode_key", "the API key is no live episode's")
            entry = {
                "id": self.model,
                "object": "model",
                "created": 0,
                "owned_by": "llamarl",
                "policy_version": self.version(),
            }
            return JSONResponse({"object": "list", "data": [entry]})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            return await self.serve(request, ChatRequest)

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            return await self.serve(request, CompletionRequest)

        return app
