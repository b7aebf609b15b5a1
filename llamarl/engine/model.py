"""Build a tiny Llama from config (seeded) or load any local Hugging Face causal-LM directory.

Loading is `from_pretrained` on a local path only: `model.path` is a directory, or a hub id
(`org/name`) whose snapshot is already in the local Hugging Face cache (`HF_HUB_CACHE`). Hub
downloads are switched off, so a missing model is an error, never a network fetch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from llamarl.config import ModelConfig
from llamarl.engine.tokenizer import CHARACTERS, build_char_tokenizer
from llamarl.errors import ConfigError
from llamarl.tasks.base import Example


@dataclass
class Policy:
    """A model and its tokenizer, the unit every role works with."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    chat: bool = False
    """Wrap prompts in the tokenizer's chat template (a user turn, then the assistant's cue)."""

    def encode_prompt(self, text: str) -> list[int]:
        if not self.chat:
            return list(self.tokenizer(text).input_ids)
        return self.encode_messages([{"role": "user", "content": text}])

    def encode_messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """A conversation rendered by the chat template (with the `tools` offered, OpenAI form),
        ending with the assistant's cue."""
        rendered = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=True,
            tokenize=False,
        )
        return list(self.tokenizer(str(rendered), add_special_tokens=False).input_ids)

    def encode_example(self, example: Example) -> list[int]:
        """An example's prompt as the model sees it: a chat row's whole conversation through
        the chat template (the config makes sure there is one), else its prompt text."""
        if example.messages:
            return self.encode_messages(example.messages)
        return self.encode_prompt(example.prompt)

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)


def build_policy(config: ModelConfig, seed: int) -> Policy:
    """A randomly initialised Llama of the configured size, with the char tokenizer."""
    tokenizer = build_char_tokenizer(CHARACTERS + config.extra_characters)
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    # A local generator keeps the global RNG untouched.
    fork_devices: list[int] = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama)
    model.eval()
    return Policy(model, tokenizer)


def _tokenizer_of(directory: Path) -> PreTrainedTokenizerBase:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.disable_progress_bar()
    if not (directory / "config.json").exists():
        raise FileNotFoundError(f"{directory}: not a local model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(path: str | Path) -> Policy:
    """Load a local HF causal-LM directory (model + tokenizer); never touches a hub."""
    directory = Path(path)
    tokenizer = _tokenizer_of(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    model.eval()
    return Policy(model, tokenizer)


def architecture_of(path: str | Path) -> Policy:
    """A model of the directory's architecture with fresh weights (to be loaded from elsewhere:
    a sharded checkpoint), and its tokenizer."""
    directory = Path(path)
    tokenizer = _tokenizer_of(directory)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    return Policy(model, tokenizer)


def save_architecture(policy: Policy, directory: str | Path) -> None:
    """The model's config and its tokenizer, without weights."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    policy.model.config.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)


def model_directory(path: str) -> Path:
    """`model.path` as a local directory: the directory itself, or a hub id's snapshot in the
    local Hugging Face cache (never downloaded). ConfigError naming model.path when neither."""
    local = Path(path)
    if (local / "config.json").is_file():
        return local
    if not local.exists() and _is_hub_id(path):
        cached = _cached_snapshot(path)
        if cached is not None and (cached / "config.json").is_file():
            return cached
        raise ConfigError(
            f"model.path {path}: not a local model directory, nor a model in the local Hugging "
            f"Face cache ({hub_constants.HF_HUB_CACHE}); fetch it there with `hf download "
            f"{path}`, import one with `llamarl model import`, or set model.path: null to build "
            "a model"
        )
    raise ConfigError(
        f"model.path {path}: not a local model directory (no config.json); import one "
        "with `llamarl model import` or set model.path: null to build a model"
    )


def _is_hub_id(path: str) -> bool:
    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def _cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot of `repo_id`'s main revision in the local hub cache, or None."""
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def check_model_path(config: ModelConfig) -> None:
    """ConfigError naming `model.path` unless it is a local model directory or a hub id in the
    local cache."""
    if config.path:
        model_directory(config.path)
    chat_template_file(config)


def chat_template_file(config: ModelConfig) -> str | None:
    """The template `model.chat_template` names by its file's path, or None for true/false; a
    ConfigError when the file cannot be read."""
    if not isinstance(config.chat_template, str):
        return None
    try:
        return Path(config.chat_template).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise ConfigError(
            f"model.chat_template {config.chat_template}: cannot read the template file "
            f"({reason}); give a Jinja chat template's path, or true for the tokenizer's own"
        ) from None


def use_chat_template(policy: Policy, config: ModelConfig) -> None:
    """Prompts through the chat template `model.chat_template` sets (its file replaces the
    tokenizer's), or none when it is false."""
    template = chat_template_file(config)
    if template is not None:
        policy.tokenizer.chat_template = template
    if config.chat_template and not policy.tokenizer.chat_template:
        raise ConfigError(f"model.chat_template: the tokenizer of {config.path} has none")
    policy.chat = bool(config.chat_template)


def make_policy(config: ModelConfig, seed: int) -> Policy:
    if config.path:
        policy = load_policy(model_directory(config.path))
    else:
        policy = build_policy(config, seed)
    use_chat_template(policy, config)
    return policy


def place(policy: Policy, device: str | torch.device, dtype: str) -> Policy:
    """The policy with its model moved to `device` and cast to `dtype` (torch's name), in place."""
    model: torch.nn.Module = policy.model
    model.to(device=torch.device(device), dtype=getattr(torch, dtype))
    return policy


def save_policy(policy: Policy, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """`save_pretrained` of model and tokenizer; `state_dict`, when given, holds the weights to
    write (a snapshot taken earlier) in place of the model's current ones."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    policy.model.save_pretrained(directory, state_dict=state_dict)
    policy.tokenizer.save_pretrained(directory)
