"""Prompt sources: the built-in arithmetic task and JSONL/Parquet prompt files."""

from llamarl.tasks.base import Example, PromptSet
from llamarl.tasks.factory import make_prompt_set

__all__ = ["Example", "PromptSet", "make_prompt_set"]
