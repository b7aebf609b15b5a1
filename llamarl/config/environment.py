"""The `environment` section: multi-turn episodes instead of one completion per prompt.

Null `kind` keeps single-turn rollouts. Otherwise every sample is an episode: the model's turn,
the environment's reply (tokens the model did not write: no loss, no behaviour log-prob), the
model's next turn, until the environment says done or a limit ends it (`llamarl.engine.episodes`).
`kind: agent` runs your own agent function instead, which talks to the model over the
generator's OpenAI-compatible endpoint (`llamarl.agents`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llamarl.config.base import USER_FUNCTION, FieldConflict, _Section, built_in_or_user

BUILT_IN_ENVIRONMENTS = ("calculator", "retry", "agent")
ToolName = Literal["calculator", "python"]


class EnvironmentConfig(_Section):
    kind: str | None = Field(None, pattern=built_in_or_user(BUILT_IN_ENVIRONMENTS))
    """calculator, retry, agent (your `agent` function over the OpenAI API), or your own
    environment class as `module:Class` (importable where the generators and the trainer run;
    docs/environments.md); null: single-turn rollouts."""
    agent: str | None = Field(None, pattern=USER_FUNCTION)
    """kind agent: your async function as `module:function`, called as `await f(row, client)`
    with the prompt row and an `openai.AsyncOpenAI` client pointed at the episode's endpoint; it
    returns the episode's reward, or None for the reward workers to score its last answer."""
    agent_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048)
    """kind agent, instead of `agent`: the agent server (`llamarl agent serve`) that plays each
    episode in a process of its own, on another host or in a container: every process that plays
    agent episodes hands it the episode (its row, the endpoint's URL and the episode's key), and
    it answers the reward. Both sides hold the secret in LLAMARL_AGENT_TOKEN."""
    max_reissues: int = Field(3, ge=0, le=100)
    """agent_url: times an episode whose agent server was lost (it died, or could not be reached)
    is handed out again under a new key; one lost more often ends agent_error."""
    demonstration: str | None = Field(None, pattern=USER_FUNCTION)
    """kind agent: `module:function` taking a prompt row and returning a worked episode's
    messages, prompt first (OpenAI form, tool calls included), or `{"messages": [...], "tools":
    [...]}` to hand the chat template the tools offered, for trainer.sft_steps."""
    max_requests: int = Field(16, ge=1, le=100_000)
    """kind agent: requests an episode may make; the one past it ends the episode
    (reason max_requests)."""
    episode_timeout_s: float = Field(120.0, gt=0, le=86_400)
    """kind agent: seconds an agent may run; one that overruns is ended (reason
    agent_timeout), never the worker."""
    tool_format: Literal["auto", "llamarl", "hermes", "mistral", "llama3_json"] = "auto"
    """kind agent: how the model writes a tool call, and so how the endpoint reads one from its
    turn and how the request's `tools`, calls and results reach the chat template: hermes
    (Hermes 2 Pro, Qwen2.5/3: `<tool_call>` JSON), mistral (`[TOOL_CALLS]`), llama3_json
    (Llama 3.1-3.3 JSON calls), llamarl (`<tool>{"NAME": "INPUT"}</tool>`, our character
    models'); auto: read from the model's chat template, llamarl without one
    (docs/environments.md)."""
    tools: list[ToolName] | None = None
    """Tools the model may call inside an episode; null: the environment's own choice
    (calculator: the calculator; retry: none)."""
    max_turns: int = Field(4, ge=1, le=1000)
    """Model turns an episode has at most."""
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    """Tokens after the prompt an episode has at most, the model's and the environment's; an
    episode that reaches it ends (reason max_tokens). generation.max_new_tokens bounds each turn."""
    step_timeout_s: float = Field(10.0, gt=0, le=3600)
    """Seconds the environment may take over one step; an environment that overruns ends its
    episode (reason env_timeout), never the worker."""
    discount: float = Field(0.5, ge=0, le=1)
    """retry: the reward of a right answer at turn t is discount^(t-1)."""
    options: dict[str, str | int | float | bool] = {}
    """Keyword options handed to your own environment class."""
    python_wall_s: float = Field(5.0, gt=0, le=600)
    """The Python tool's wall-clock limit a call."""
    python_cpu_s: int = Field(2, ge=1, le=600)
    """The Python tool's CPU-time limit a call, all its processes together."""
    python_memory_mb: int = Field(512, ge=64, le=65536)
    """The Python tool's memory limit a call, all its processes, memfds and files together."""
    python_output_bytes: int = Field(65536, ge=64, le=16 << 20)
    """The Python tool's stdout and stderr limit a call; more kills the call."""
    python_work_mb: int = Field(16, ge=1, le=4096)
    """Size of the Python tool's /work a call (a tmpfs; a write past it gets ENOSPC)."""
    python_work_files: int = Field(4096, ge=16, le=1 << 20)
    """Files and directories the Python tool's /work may hold a call (ENOSPC past it)."""

    @model_validator(mode="after")
    def _fields_agree(self) -> EnvironmentConfig:
        if self.kind is None and (self.tools or self.options):
            raise FieldConflict(("tools", "kind"), "tools and options belong to an environment; set kind")
        if (self.kind == "agent") != (self.agent is not None or self.agent_url is not None):
            raise FieldConflict(
                ("agent", "kind"),
                "kind agent runs the function `agent` names (or agent_url's server), and only it does: "
                "set both or neither",
            )
        if self.agent is not None and self.agent_url is not None:
            raise FieldConflict(
                ("agent", "agent_url"),
                "an agent runs in the generator (agent) or on an agent server (agent_url); set one",
            )
        if self.kind == "agent" and self.tools:
            raise FieldConflict(("tools", "kind"), "an agent calls its own tools; drop environment.tools")
        if self.tool_format != "auto" and self.kind != "agent":
            message = "tool_format is how an agent's model writes its calls; set kind agent"
            raise FieldConflict(("tool_format", "kind"), message)
        if self.demonstration is not None and self.kind != "agent":
            raise FieldConflict(
                ("demonstration", "kind"),
                "an environment class writes its own demonstration(); demonstration is for kind agent",
            )
        return self
