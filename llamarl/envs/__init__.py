"""Environments for multi-turn episodes: the interface (`base`), the built-in `calculator` and
`retry`, and `registry`, which turns `environment.kind` into a class, checked before a run."""

from llamarl.envs.base import EnvContext, Environment, EnvStep, Message

__all__ = ["EnvContext", "EnvStep", "Environment", "Message"]
