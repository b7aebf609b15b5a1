"""The vLLM engine's checks before a run starts (`llamarl.launch.engine_checks`), those that
need neither vLLM nor a GPU: each refusal is one ConfigError naming the field and what to do.
(The architecture check and the real engine are in tests/vllm.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.engine_checks import check_engine


def _model(tmp_path: Path, positions: int = 64) -> str:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": positions})
    )
    return str(tmp_path)


def _check(model_path: str | None, **generation: Any) -> None:
    tree: dict[str, Any] = {"generation": {"engine": "vllm", **generation}}
    if model_path is not None:
        tree["model"] = {"path": model_path}
    check_engine(parse_config(tree))


@pytest.fixture
def vllm_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """find_spec finds vLLM whether or not this environment has it (the checks below come
    before anything imports it)."""
    real = importlib.util.find_spec
    spec = real("json")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else real(name, *a))


def test_a_missing_vllm_is_refused_with_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(
        ConfigError,
        match=r"vllm is not installed here; install it with `bash scripts/setup.sh --vllm`",
    ):
        _check(_model(tmp_path))


def test_the_native_engine_needs_nothing(tmp_path: Path) -> None:
    check_engine(parse_config({}))


@pytest.mark.usefixtures("vllm_present")
@pytest.mark.parametrize(
    ("generation", "message"),
    [
        ({"vllm": {"tensor_parallel_size": 2}}, r"tensor_parallel_size: 2 needs CUDA GPUs"),
        ({"vllm": {"max_model_len": 128}}, r"max_model_len: 128 is longer than the 64 positions"),
        ({"max_new_tokens": 64}, r"max_new_tokens: 64 leaves no room for a prompt"),
        ({"max_new_tokens": 32, "vllm": {"max_model_len": 32}}, r"max_model_len 32; raise"),
    ],
)
def test_a_config_the_engine_cannot_serve_is_refused(tmp_path: Path, generation: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _check(_model(tmp_path), **generation)


@pytest.mark.usefixtures("vllm_present")
def test_the_built_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"built character model is none; set model.path"):
        _check(None)
