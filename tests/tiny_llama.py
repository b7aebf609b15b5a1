"""The smallest Llama a test's tokenizer fits: one layer, hidden size 16, the tokenizer's
vocabulary and pad and EOS ids."""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig, PreTrainedTokenizerBase


def tiny_llama_config(tokenizer: PreTrainedTokenizerBase, max_positions: int, **more: Any) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **more,
    )
