"""`model.path` as a hub id (`org/name`), resolved from a local Hugging Face cache laid out as
the hub lays it (`models--org--name/snapshots/<revision>/`, `refs/main`), offline; a hub id that
is not there, or a directory that is not a model, is one line naming model.path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hub_constants

from llamarl.config import ModelConfig
from llamarl.engine.model import (
    build_policy,
    check_model_path,
    make_policy,
    model_directory,
    save_policy,
)
from llamarl.errors import ConfigError
from llamarl.training.memory import model_shape

REVISION = "0123456789abcdef0123456789abcdef01234567"
TINY = ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline hub cache holding `org/tiny`; the hub library reads its cache and offline
    settings at import, so they are set in its constants as well as in the environment."""
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    save_policy(build_policy(TINY, seed=3), repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_loads_from_the_local_cache_offline(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ModelConfig(path="org/tiny")
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / REVISION
    assert model_directory("org/tiny") == snapshot
    check_model_path(config)
    policy = make_policy(config, seed=0)
    built = build_policy(TINY, seed=3).model.state_dict()
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(tensor, built[name]), name
    assert model_shape(config).num_layers == 1  # what the launcher's memory check reads

    from workers.cli import main

    monkeypatch.setattr(os, "environ", dict(os.environ))
    assert main(["config", "check", str(_config(hub_cache.parent, "org/tiny"))]) == 0
    assert "path: org/tiny" in capsys.readouterr().out


def _config(directory: Path, model_path: str) -> Path:
    path = directory / "hub.yaml"
    path.write_text(f"model:\n  path: {model_path}\n")
    return path


def test_a_hub_id_missing_from_the_cache_is_one_line(hub_cache: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        check_model_path(ModelConfig(path="org/absent"))
    assert str(raised.value) == (
        f"model.path org/absent: not a local model directory, nor a model in the local Hugging "
        f"Face cache ({hub_cache}); fetch it there with `hf download org/absent`, import one "
        "with `llamarl model import`, or set model.path: null to build a model"
    )


def test_a_directory_that_is_no_model_keeps_its_line(hub_cache: Path, tmp_path: Path) -> None:
    """An existing directory (and a path no hub id could be) is never looked up in the cache."""
    for path in (tmp_path, tmp_path / "nothing"):
        with pytest.raises(ConfigError) as raised:
            check_model_path(ModelConfig(path=str(path)))
        assert str(raised.value) == (
            f"model.path {path}: not a local model directory (no config.json); import one with "
            "`llamarl model import` or set model.path: null to build a model"
        )


def test_a_chat_template_file_replaces_the_tokenizers_own_and_saved_models_carry_it(tmp_path: Path) -> None:
    save_policy(build_policy(TINY, seed=3), tmp_path / "model")
    template = tmp_path / "chat.jinja"
    template.write_text(  # the built model's characters only: digits and +-*= and space
        "{% for m in messages %}-{{ m.content }}{% endfor %}{% if add_generation_prompt %} ={% endif %}"
    )
    config = ModelConfig(path=str(tmp_path / "model"), chat_template=str(template))
    check_model_path(config)
    policy = make_policy(config, seed=0)
    assert policy.chat
    assert policy.tokenizer.decode(policy.encode_prompt("1+2=")) == "-1+2= ="
    save_policy(policy, tmp_path / "saved")
    assert make_policy(ModelConfig(path=str(tmp_path / "saved"), chat_template=True), seed=0).encode_prompt(
        "1+2="
    ) == policy.encode_prompt("1+2=")


def test_a_chat_template_file_that_cannot_be_read_is_one_line_naming_the_field(tmp_path: Path) -> None:
    save_policy(build_policy(TINY, seed=3), tmp_path / "model")
    config = ModelConfig(path=str(tmp_path / "model"), chat_template=str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError) as refused:
        check_model_path(config)
    message = str(refused.value)
    assert message.startswith(f"model.chat_template {tmp_path / 'missing.jinja'}: cannot read") and "\n" not in message
