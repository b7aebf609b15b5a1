"""What a vLLM engine is loaded with (`merged_weights`): a plain model's weights as they are,
and a LoRA model's base with its adapters merged in, under the Hugging Face names vLLM loads,
equal to peft's own merge."""

from __future__ import annotations

import copy

import torch

from llamarl.config import LoraConfig, ModelConfig
from llamarl.engine.adapters import merged, with_adapters
from llamarl.engine.model import build_policy
from llamarl.engine.vllm_engine import merged_weights

SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def test_a_plain_model_is_loaded_as_it_is() -> None:
    policy = build_policy(SMALL, seed=0)
    weights = dict(merged_weights(policy.model))
    assert weights.keys() == policy.model.state_dict().keys()
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(weights[name], tensor)


def test_lora_adapters_are_merged_into_the_base_weights() -> None:
    policy = with_adapters(build_policy(SMALL, seed=0), LoraConfig(r=4, alpha=8), seed=0)
    with torch.no_grad():  # a trained version: lora_B starts at zeros, which would merge nothing
        for name, weight in policy.model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    expected = merged(copy.deepcopy(policy)).model.state_dict()
    weights = dict(merged_weights(policy.model))
    assert weights.keys() == expected.keys()
    changed = 0
    for name, tensor in expected.items():
        assert torch.allclose(weights[name], tensor, atol=1e-6), name
        changed += not torch.equal(tensor, build_policy(SMALL, seed=0).model.state_dict()[name])
    assert changed == 2 * 4, "each layer's q, k, v and o projections carry an update"
