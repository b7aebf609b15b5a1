"""A user's own reward function, named in the config as `task.reward: module:function`.

The function takes (completion text, reference answer) and returns a float; it is imported where
the reward workers run (the module must be importable there: installed, or on PYTHONPATH or the
working directory). It is checked before a run starts, and guarded like the built-in verifiers:
an exception or a non-number scores 0.0 and is logged, never taking the worker down.
"""

from __future__ import annotations

from llamarl.errors import ConfigError
from llamarl.rewards.verifiers import Verifier, guarded
from llamarl.user_code import load_named


def load_reward(spec: str) -> Verifier:
    """The function `module:function` names, guarded; ConfigError naming task.reward when it
    cannot be imported or is not callable."""
    function = load_named(spec, "task.reward")
    if not callable(function):
        raise ConfigError(
            f"task.reward {spec}: {spec.replace(':', ' has no function ')}; name one that "
            "takes (completion, answer) and returns a float"
        )
    return guarded(spec, function)
