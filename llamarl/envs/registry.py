"""From `environment` config to environments: the built-in classes by name, your own by
`module:Class` (imported and checked before anything starts, like `task.reward`), the tools the
config allows, and the factory that makes one environment an episode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamarl.config import EnvironmentConfig
from llamarl.envs.base import EnvContext, Environment
from llamarl.envs.calculator import CalculatorEnv, RetryEnv
from llamarl.errors import ConfigError
from llamarl.rewards.verifiers import Verifier
from llamarl.tools import Tool
from llamarl.tools.calculator import Calculator
from llamarl.user_code import load_named

BUILT_IN: dict[str, type] = {"calculator": CalculatorEnv, "retry": RetryEnv}
DEFAULT_TOOLS = {"calculator": ["calculator"], "retry": []}


def environment_class(kind: str) -> Callable[[EnvContext], Any]:
    """The class `kind` names; ConfigError naming environment.kind when it cannot be imported or
    lacks `start` and `step`."""
    if kind in BUILT_IN:
        return BUILT_IN[kind]
    cls = load_named(kind, "environment.kind")
    if not isinstance(cls, type) or not all(callable(getattr(cls, name, None)) for name in ("start", "step")):
        raise ConfigError(
            f"environment.kind {kind}: {kind.replace(':', '.')} is not a class with start() "
            "and step(); see docs/environments.md"
        )
    return cls


def make_tools(config: EnvironmentConfig) -> dict[str, Tool]:
    """The tools an episode may call, by name (the Python runner checks its limits here)."""
    assert config.kind is not None
    names = config.tools if config.tools is not None else DEFAULT_TOOLS.get(config.kind, [])
    tools: dict[str, Tool] = {}
    for name in names:
        if name == "calculator":
            tools[name] = Calculator()
        else:
            from llamarl.tools.python_runner import PythonRunner
            from llamarl.tools.sandbox import SandboxLimits

            tools[name] = PythonRunner(
                SandboxLimits(
                    cpu_s=config.python_cpu_s,
                    memory_mb=config.python_memory_mb,
                    output_bytes=config.python_output_bytes,
                    wall_s=config.python_wall_s,
                    work_bytes=config.python_work_mb << 20,
                    work_files=config.python_work_files,
                )
            )
    return tools


class EnvFactory:
    """Makes one environment an episode, all sharing the run's tools."""

    def __init__(self, config: EnvironmentConfig, verifier: Verifier) -> None:
        assert config.kind is not None
        self.config = config
        self.cls = environment_class(config.kind)
        self.context = EnvContext(make_tools(config), verifier, config.discount, config.options)

    def new(self) -> Environment:
        environment: Environment = self.cls(self.context)
        return environment
