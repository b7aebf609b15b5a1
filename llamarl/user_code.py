"""Importing what a config names as `module:name` (a reward function, an environment class):
the module must be importable where the workers run, and a failure is a ConfigError naming the
config field, checked before a run starts."""

from __future__ import annotations

import importlib
from typing import Any

from llamarl.errors import ConfigError


def load_named(spec: str, field: str) -> Any:
    """The attribute `module:name` names, or None when the module has no such name;
    ConfigError naming `field` when the module cannot be imported."""
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any failure importing user code is a configuration problem
        raise ConfigError(
            f"{field} {spec}: cannot import {module_name} ({type(err).__name__}: {err}); "
            "install it or put it on PYTHONPATH"
        ) from None
    return getattr(module, name, None)
