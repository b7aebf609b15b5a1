"""Importing what a config names as `module:name` (a reward function, an environment class):
the module must be importable where the workers run, and a failure is a ConfigError naming the
config field, checked before a run starts."""

from __future__ import annotations

import importlib
from collections.abc import Callable
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


def load_function(spec: str, field: str, hint: str) -> Callable[..., Any]:
    """The function `module:name` names; ConfigError naming `field` when it cannot be imported
    or is not a function, ending in `hint` (what to write instead)."""
    function = load_named(spec, field)
    if not callable(function):
        module_name, _, name = spec.partition(":")
        raise ConfigError(f"{field} {spec}: {module_name} has no function {name}; {hint}")
    return function
