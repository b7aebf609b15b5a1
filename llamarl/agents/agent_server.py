"""The agent server (`llamarl agent serve --agent module:function`): plays the episodes that runs
with `environment.agent_url` hand it, `POST /episodes` (`llamarl.agents.remote` describes the
exchange). Each agent runs on a thread and event loop of its own, as in a generator, so one that
blocks holds up no other; at most `max_episodes` at once, more are answered 429 (and handed out
again by the run)."""

from __future__ import annotations

import asyncio
import secrets
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamarl.agents.isolation import prepare_client
from llamarl.agents.play import Agent, agent_function, play_once, reward_of
from llamarl.agents.remote import agent_token


class Handed(BaseModel):
    """An episode handed over."""

    model_config = ConfigDict(extra="forbid")

    row: dict[str, Any]
    base_url: str = Field(pattern=r"^https?://\S+$", max_length=2048)
    key: str = Field(min_length=1, max_length=256)
    timeout_s: float = Field(gt=0, le=86_400)


def agent_server_app(agent: Agent, token: str, max_episodes: int) -> Any:
    """The agent server's HTTP app: `POST /episodes` (see the module's doc), at most
    `max_episodes` at once (more are answered 429, and handed out again)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    playing = asyncio.Semaphore(max_episodes)
    threads = ThreadPoolExecutor(max_episodes, thread_name_prefix="agent")

    async def episodes(request: Request) -> JSONResponse:
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(secret.encode(), token.encode()):
            return JSONResponse({"error": "not the agents' secret"}, status_code=401)
        try:
            handed = Handed.model_validate(await request.json())
        except (ValueError, ValidationError) as err:
            return JSONResponse({"error": f"not an episode: {str(err)[:200]}"}, status_code=400)
        if playing.locked():
            return JSONResponse({"error": f"{max_episodes} episodes at once already"}, status_code=429)
        async with playing:
            # A thread and event loop each, as in a generator: an agent that blocks holds up no other.
            one = partial(play_once, agent, handed.row, handed.base_url, handed.key, handed.timeout_s)
            try:
                value = await asyncio.get_running_loop().run_in_executor(threads, one)
                return JSONResponse({"reward": reward_of(value)})
            except Exception as err:  # the agent's own failure: its episode's end, not the server's
                return JSONResponse({"error": f"{type(err).__name__}: {err}"[:300]})

    app.add_api_route("/episodes", episodes, methods=["POST"])
    return app


def serve_agents(spec: str, host: str, port: int, max_episodes: int) -> None:
    """Serve the agent function `spec` names until stopped."""
    token = agent_token()
    agent = agent_function(spec)
    prepare_client()
    app = agent_server_app(agent, token, max_episodes)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=5)
