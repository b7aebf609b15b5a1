"""The key/value cache argument of a Hugging Face model across transformers versions.

transformers 5.20 renamed a model's `past_key_values` (argument and output field) to `cache`.
vLLM 0.32 (the `vllm` extra) needs transformers below 5.20, so llamarl takes both: every call
that passes or reads a cache goes through these two functions.
"""

from __future__ import annotations

from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""The name this transformers gives the cache, as a model argument and an output field."""


def with_cache(cache: Any) -> dict[str, Any]:
    """A model call's keyword argument that passes `cache`."""
    return {CACHE_FIELD: cache}


def cache_of(output: Any) -> Any:
    """The cache a model call returned."""
    return getattr(output, CACHE_FIELD)
