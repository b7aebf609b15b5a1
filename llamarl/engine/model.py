"""Build a tiny Llama from config (seeded) or load any local Hugging Face causal-LM directory.

Loading is `from_pretrained` on a local path only; hub downloads are switched off, so a missing
directory is an error, never a network fetch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
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
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer(str(rendered), add_special_tokens=False).input_ids)

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
    model = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=torch.float32
    )
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


def check_model_path(config: ModelConfig) -> None:
    """ConfigError naming `model.path` unless it is a local model directory (a config.json)."""
    if config.path and not (Path(config.path) / "config.json").is_file():
        raise ConfigError(
            f"model.path {config.path}: not a local model directory (no config.json); import one "
            "with `llamarl model import` or set model.path: null to build a model"
        )


def make_policy(config: ModelConfig, seed: int) -> Policy:
    check_model_path(config)
    policy = load_policy(config.path) if config.path else build_policy(config, seed)
    if config.chat_template:
        if not policy.tokenizer.chat_template:
            raise ConfigError(f"model.chat_template: the tokenizer of {config.path} has none")
        policy.chat = True
    return policy


def place(policy: Policy, device: str | torch.device, dtype: str) -> Policy:
    """The policy with its model moved to `device` and cast to `dtype` (torch's name), in place."""
    model: torch.nn.Module = policy.model
    model.to(device=torch.device(device), dtype=getattr(torch, dtype))
    return policy


def save_policy(
    policy: Policy, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """`save_pretrained` of model and tokenizer; `state_dict`, when given, holds the weights to
    write (a snapshot taken earlier) in place of the model's current ones."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    policy.model.save_pretrained(directory, state_dict=state_dict)
    policy.tokenizer.save_pretrained(directory)
