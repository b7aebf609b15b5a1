"""Prompt sources: the built-in arithmetic task and a user's own data (JSON lines, JSON,
Parquet, CSV files and save_to_disk directories, plain or chat rows)."""

from llamarl.tasks.base import DataError, Example, PromptSet
from llamarl.tasks.factory import make_prompt_set
from llamarl.tasks.files import read_examples

__all__ = ["DataError", "Example", "PromptSet", "make_prompt_set", "read_examples"]
