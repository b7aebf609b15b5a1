"""Environments written for OpenEnv (`openenv-core`, Gym-style: `reset` and `step` with pydantic
actions and observations) trained as agents: `openenv_agent` makes the agent function that plays
one with the model over the endpoint.

Each episode makes its own environment, resets it with the prompt row as keyword arguments, and
shows the model each observation as a user message; the model's reply becomes the next action,
until the environment says done or `max_turns` replies. The episode's reward is the last one an
observation gave (None throughout: the reward workers score the model's last reply).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from llamarl.agents.play import Agent

NOT_SHOWN = {"done", "reward", "metadata"}


def observation_text(observation: Any) -> str:
    """What the model reads of an observation: its one text field, else its fields as JSON."""
    fields = observation.model_dump(exclude=NOT_SHOWN)
    texts = [v for v in fields.values() if isinstance(v, str)]
    return texts[0] if len(fields) == 1 and texts else json.dumps(fields, default=str)


def openenv_agent(
    environment: Callable[[], Any],
    action: Callable[[str], Any],
    *,
    observe: Callable[[Any], str] = observation_text,
    max_turns: int = 8,
) -> Agent:
    """The agent function for `environment` (an OpenEnv `Environment` class or factory), whose
    actions `action` makes from the model's reply text."""

    async def agent(row: dict[str, Any], client: Any) -> float | None:
        env = environment()
        try:
            return await play(env, row, client)
        finally:
            env.close()

    async def play(env: Any, row: dict[str, Any], client: Any) -> float | None:
        observation = await env.reset_async(**row)
        messages: list[dict[str, Any]] = [{"role": "user", "content": observe(observation)}]
        reward = observation.reward
        for _ in range(max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            observation = await env.step_async(action(message.content or ""))
            reward = reward if observation.reward is None else observation.reward
            if observation.done:
                break
            messages.append({"role": "user", "content": observe(observation)})
        return None if reward is None else float(reward)

    return agent
