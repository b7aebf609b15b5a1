"""The `environment` section: multi-turn episodes instead of one completion per prompt.

Null `kind` keeps single-turn rollouts. Otherwise every sample is an episode: the model's turn,
the environment's reply (tokens the model did not write: no loss, no behaviour log-prob), the
model's next turn, until the environment says done or a limit ends it (`llamarl.engine.episodes`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llamarl.config.base import FieldConflict, _Section

BUILT_IN_ENVIRONMENTS = ("calculator", "retry")
ToolName = Literal["calculator", "python"]


class EnvironmentConfig(_Section):
    kind: str | None = Field(None, pattern=r"^(calculator|retry|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")
    """calculator, retry, or your own environment class as `module:Class` (importable where
    the generators and the trainer run; docs/environments.md); null: single-turn rollouts."""
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
            raise FieldConflict(
                ("tools", "kind"), "tools and options belong to an environment; set kind"
            )
        return self
