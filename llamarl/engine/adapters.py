"""LoRA adapters (peft) on a policy: the base stays frozen, only the adapters train and travel.

The trainer and every generator put the same adapters (`model.lora`) on the same base (the
model at `model.path`, or the seeded built one), so a version is the adapter tensors alone
(`llamarl.weightsync.flat.weight_objects`). Generators compute with peft's layers as they are
(base output plus the low-rank update) rather than merging each version into the base weights:
merging would need a copy of every adapted weight to merge the next version into. At the end
of a run the adapters are saved as a peft adapter directory and merged into a whole Hugging
Face model. peft is imported when adapters are first made or loaded (it takes seconds, and
most runs use none): a model is a peft model only once peft is imported.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

from llamarl.config import LoraConfig
from llamarl.engine.model import Policy

ADAPTER_CONFIG = "adapter_config.json"


def has_adapters(model: torch.nn.Module) -> bool:
    peft = sys.modules.get("peft")  # no model has adapters before peft is imported
    return peft is not None and isinstance(model, peft.PeftModel)


def with_adapters(policy: Policy, lora: LoraConfig | None, seed: int = 0) -> Policy:
    """The policy with fresh adapters (the update starts at zero: lora_B is zeros), or as it
    is without `lora` or when it has them already. The adapters' random part is drawn from
    `seed` without touching the global RNG."""
    if lora is None or has_adapters(policy.model):
        return policy
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft takes any number
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = get_peft_model(policy.model, config)
    return dataclasses.replace(policy, model=model)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the adapter tensors, under the model's own names."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def save_adapters(policy: Policy, directory: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """A peft adapter directory (adapter_config.json, adapter weights) with the tokenizer;
    `state` (from `adapter_state`) in place of the current adapters when given."""
    directory.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(directory, state_dict=state)
    policy.tokenizer.save_pretrained(directory)


def save_adapter_config(policy: Policy, directory: Path) -> None:
    """The adapters' shape alone (a sharded checkpoint keeps their weights with the rest)."""
    model: Any = policy.model
    model.peft_config["default"].save_pretrained(directory)


def load_adapters(policy: Policy, directory: Path, trainable: bool = True) -> Policy:
    """The base `policy` with the adapters saved in `directory` (an adapter directory, or one
    with adapter_config.json only: fresh weights, to be loaded from elsewhere)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    if (directory / "adapter_model.safetensors").exists():
        model: Any = PeftModel.from_pretrained(policy.model, directory, is_trainable=trainable)
    else:
        config = PeftLoraConfig.from_pretrained(str(directory))
        model = get_peft_model(policy.model, config)
    return dataclasses.replace(policy, model=model)


def merged(policy: Policy) -> Policy:
    """The base with the adapters' update added into its weights, as a plain Hugging Face model
    (changes the policy's model in place)."""
    model: Any = policy.model
    return dataclasses.replace(policy, model=model.merge_and_unload())
