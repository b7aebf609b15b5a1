"""`generation.openai`: the OpenAI-compatible endpoint a generator serves its agents' episodes
on (`environment.kind: agent`, `llamarl.agents`), and the bounds it holds every request to."""

from __future__ import annotations

from pydantic import Field

from llamarl.config.base import _Section


class EndpointConfig(_Section):
    host: str = Field("127.0.0.1", min_length=1, max_length=255)
    """The address the endpoint listens on: loopback by default, so only the generator's own
    host can reach it (the agents run in the generator's process). An agent that hands the
    endpoint on to a process on another host (a container, a remote tool) needs an address that
    host can reach."""
    port: int = Field(0, ge=0, le=65535)
    """The port (0: a free one, picked at start and handed to each agent's client). A fixed
    port serves one generator a host; an evaluation's own endpoint always takes a free one."""
    max_request_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    """The largest request body; a larger one is answered 413 and counted."""
    max_concurrent: int = Field(256, ge=1, le=65536)
    """Requests served at once, all episodes together; more are answered 429 and counted."""
    max_choices: int = Field(8, ge=1, le=64)
    """The most choices (`n`) a request may ask for; more is answered 400."""
    batch_wait_ms: float = Field(20.0, ge=0, le=10_000)
    """How long a batch of waiting requests waits for more after the last one arrived (a batch
    is sampled at once when every running episode is waiting)."""
