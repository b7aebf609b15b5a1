"""What a launch checks of an agent run (`environment.kind: agent`) before it starts anything:
the `agents` extra is installed, the agent is an async function that imports (an agent server:
the secret is set and the endpoint's address is one it can reach), a fixed endpoint
port is free, and a warm start's demonstrations are written well-formed (tried on the first
training prompt)."""

from __future__ import annotations

import importlib.util
import socket

from llamarl.agents.demonstrations import AgentDemonstrations
from llamarl.agents.play import agent_function
from llamarl.agents.remote import agent_token
from llamarl.config import RunConfig
from llamarl.errors import ConfigError
from llamarl.net import address_family
from llamarl.tasks import make_prompt_set

AGENT_PACKAGES = ("fastapi", "uvicorn", "openai")
"""What the endpoint and the agents' client import: the `agents` extra."""
WILDCARDS = ("0.0.0.0", "::", "")
"""Addresses a server listens on but no agent can reach it at."""


def check_agent(config: RunConfig) -> None:
    """ConfigError naming the environment field that is wrong."""
    environment = config.environment
    missing = [name for name in AGENT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"environment.kind agent: {', '.join(missing)} not installed; pip install 'llamarl[agents]'")
    endpoint = config.generation.openai
    if environment.agent is not None:
        agent_function(environment.agent)
    else:
        agent_token()
        if endpoint.host in WILDCARDS:
            raise ConfigError(
                f"generation.openai.host {endpoint.host}: agent servers play at the address the endpoint "
                "names; set this host's address (per host: LLAMARL__GENERATION__OPENAI__HOST)"
            )
    if endpoint.port:  # a fixed port: free now, or every generator would fail to start
        with socket.socket(address_family(endpoint.host)) as probe:
            try:
                probe.bind((endpoint.host, endpoint.port))
            except OSError as err:
                raise ConfigError(
                    f"generation.openai.port {endpoint.port}: cannot listen on "
                    f"{endpoint.host}:{endpoint.port} ({err.strerror}); pick a free port, or 0 "
                    "for any"
                ) from None
    if not config.trainer.sft_steps:
        return
    if environment.demonstration is None:
        raise ConfigError(
            "trainer.sft_steps: an agent warm-starts on the conversations "
            "environment.demonstration writes; set it, or set trainer.sft_steps: 0"
        )
    demonstrations = AgentDemonstrations(environment.demonstration)
    example = make_prompt_set(config.task, config.seed).train_item(0)
    try:
        demonstrations.demonstration(example)
    except ConfigError:
        raise
    except Exception as err:  # the user's function failing is a configuration problem
        raise ConfigError(
            f"environment.demonstration {environment.demonstration}: failed on the first "
            f"prompt ({type(err).__name__}: {err})"
        ) from None
