"""Agents in processes of their own (`environment.agent_url`): an agent server plays episodes
that the processes playing agent episodes (generators, and the trainer's evaluations) hand it.

The hand-over is `POST {agent_url}/episodes`, `Authorization: Bearer` the secret in
LLAMARL_AGENT_TOKEN, with `{"row", "base_url", "key", "timeout_s"}`: the prompt's data row, the
OpenAI endpoint to play at and the episode's key. The server runs your agent function with an
`openai.AsyncOpenAI` client on that URL and key, exactly as a generator runs it in process, and
answers `{"reward": number or null}` (null: the reward workers score the last turn) or
`{"error": text}` once the agent returns or raises. The reward travels back on the connection the
episode was handed over on, so no other process can post one.

An agent server that cannot be reached, answers 429 or 5xx, or whose connection breaks before
its answer (it was killed, or its host lost) has lost the episode (`AgentLost`): the episode is
handed out again under a new key, up to `environment.max_reissues` times; the old key is revoked
at once, so the lost agent's later requests are refused (401) and nothing it sampled is trained.
The server is `llamarl.agents.agent_server` (`llamarl agent serve --agent module:function`).
"""

from __future__ import annotations

import os
from typing import Any

from llamarl.agents.play import Agent, AgentLost
from llamarl.errors import ConfigError

AGENT_TOKEN = "LLAMARL_AGENT_TOKEN"
"""The environment variable holding the hand-over's secret, on both sides."""
MIN_TOKEN_CHARS = 16
LOST_STATUSES = {429, 500, 502, 503, 504}
"""An agent server's answers that say it could not play the episode (busy, or failing)."""


def agent_token() -> str:
    """The secret from LLAMARL_AGENT_TOKEN; ConfigError when it is missing or short."""
    token = os.environ.get(AGENT_TOKEN, "")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{AGENT_TOKEN}: set it to a secret of {MIN_TOKEN_CHARS} characters or more (e.g. `openssl rand -hex 16`), "
            "the same where the runs and the agent servers start"
        )
    return token


def remote_agent(url: str, timeout_s: float) -> Agent:
    """The agent function that hands each episode to the agent server at `url` (an episode has
    `timeout_s` there)."""
    import httpx

    token = agent_token()
    episodes = url.rstrip("/") + "/episodes"

    async def agent(row: dict[str, Any], client: Any) -> Any:
        body = {"row": row, "base_url": str(client.base_url), "key": client.api_key, "timeout_s": timeout_s}
        async with httpx.AsyncClient(timeout=None, trust_env=False) as http:
            try:
                answer = await http.post(episodes, json=body, headers={"Authorization": f"Bearer {token}"})
            except httpx.HTTPError as err:
                raise AgentLost(f"{url}: {type(err).__name__}: {err}") from None
        if answer.status_code in LOST_STATUSES:
            raise AgentLost(f"{url} answered {answer.status_code}")
        if answer.status_code != 200:
            raise RuntimeError(f"the agent server at {url} answered {answer.status_code}: {answer.text[:200]}")
        result = answer.json()
        if result.get("error") is not None:
            raise RuntimeError(str(result["error"])[:300])
        return result.get("reward")

    return agent
