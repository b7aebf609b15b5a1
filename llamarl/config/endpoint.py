"""`generation.openai`: the OpenAI-compatible endpoint a generator serves its agents' episodes
on (`environment.kind: agent`, `llamarl.agents`), and the bounds it holds every request to."""

from __future__ import annotations

from pydantic import Field, model_validator

from llamarl.config.base import FieldConflict, _Section


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
    max_concurrent_per_episode: int = Field(4, ge=1, le=65536)
    """Requests one episode may have in flight at once (a body being read or an answer awaited),
    each holding its connection; more are answered 429 and counted (`episode_concurrent`), so one
    episode cannot hold every slot of `max_concurrent`."""
    max_connections: int = Field(1024, ge=2, le=1 << 20)
    """Open connections, all episodes together. One more closes the connection that has gone
    longest without a request in progress (counted, `connection_evicted`): idle connections
    cannot crowd out a new request. It must be above `max_concurrent`, so that some connection
    always has no request in flight."""
    idle_timeout_s: float = Field(10.0, gt=0, le=3600)
    """A connection that sends nothing this long, after it opened or after its last answer, is
    closed. Longer than the 5 s an agent's `openai` client keeps an idle connection for reuse,
    so a client never sends a request on a connection the endpoint is closing."""
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    """The longest a request's headers may take from their first byte (and the unread rest of a
    refused request's body, from its answer); a connection still sending them then is closed
    (counted, `header_timeout`)."""
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    """The longest a request's body may take after its headers; a slower one is answered 408
    and its connection closed (counted, `body_timeout`)."""
    max_choices: int = Field(8, ge=1, le=64)
    """The most choices (`n`) a request may ask for; more is answered 400."""
    batch_wait_ms: float = Field(20.0, ge=0, le=10_000)
    """How long a batch of waiting requests waits for more after the last one arrived (a batch
    is sampled at once when every running episode is waiting)."""

    @model_validator(mode="after")
    def _connections_above_requests(self) -> EndpointConfig:
        if self.max_connections <= self.max_concurrent:
            raise FieldConflict(
                ("max_connections", "max_concurrent"),
                "max_connections must be above max_concurrent (connections with no request in flight are closed first)",
            )
        return self
