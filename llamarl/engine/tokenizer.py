"""A character-level tokenizer for the built-in tasks, in Hugging Face format.

It is a `tokenizers` WordLevel model over single characters wrapped as `PreTrainedTokenizerFast`,
so `save_pretrained` writes files that plain `AutoTokenizer.from_pretrained` reads back.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS = "<pad>", "<eos>"
CHARACTERS = "0123456789+-*= "


def build_char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    unique = dict.fromkeys(characters)  # each once, in order
    vocab = {PAD: 0, EOS: 1} | {ch: i + 2 for i, ch in enumerate(unique)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS)
    tokenizer.padding_side = "left"
    return tokenizer
