"""The run config's `task` section: where prompts come from (the built-in arithmetic task or a
data file), how each is written, and what scores a completion (a verifier, the user's reward
function, a reward model, a generative judge)."""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import Field, model_validator

from llamarl.config.base import USER_FUNCTION, FieldConflict, _Section


def template_fields(template: str) -> set[str]:
    """The field names a format string uses; ValueError on a malformed one or on a positional
    field (`{}`, `{0}`)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"prompt_template is not a format string: {err}") from None
    names = set()
    for _, name, _, _ in parsed:
        if name is None:
            continue
        base = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not base.isidentifier():
            raise ValueError(
                f"prompt_template: {{{name}}} is not a field name; use {{a}}, {{b}} or a prompt file's field names"
            )
        names.add(base)
    return names


DATA_FIELDS = (
    "format",
    "eval_split",
    "eval_path",
    "eval_fraction",
    "messages_field",
    "system_prompt",
)
"""Fields of data files that kind arithmetic refuses when set."""


class TaskConfig(_Section):
    kind: Literal["arithmetic", "file", "jsonl", "parquet"] = "arithmetic"
    """Built-in arithmetic task, or your own data at `path`: `file` reads JSON lines, JSON,
    Parquet and CSV files (by extension, or `format`) and `Dataset.save_to_disk` /
    `DatasetDict.save_to_disk` directories; `jsonl` and `parquet` are `file` with that format."""
    num_digits: int = Field(2, ge=1, le=9)
    """Digits per operand of the arithmetic task."""
    operation: Literal["+", "*"] = "+"
    """The arithmetic task's operation: addition, or multiplication (`1234*5678=`)."""
    num_eval: int = Field(200, ge=1, le=100_000)
    """Held-out prompts used for accuracy. A data file without eval_split, eval_path or
    eval_fraction holds this many of its rows out of training (the first ones, after
    shuffling); otherwise at most this many of the held-out rows are evaluated."""
    path: str | None = None
    """Your data (kind file, jsonl or parquet): a local file or a save_to_disk directory, read
    with Hugging Face `datasets` (memory-mapped Arrow, row by row; nothing is downloaded)."""
    format: Literal["json", "parquet", "csv"] | None = None
    """kind file: the format of path and eval_path when their extension does not say it
    (.jsonl/.json, .parquet, .csv); a directory is always a save_to_disk dataset."""
    split: str = "train"
    """The split of a DatasetDict directory at path to train on."""
    eval_split: str | None = None
    """Held-out rows from this split of a DatasetDict directory (the one at eval_path, if set,
    else at path), never trained on."""
    eval_path: str | None = None
    """Held-out rows from this file or save_to_disk directory (same fields as path), never
    trained on."""
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    """Hold this fraction of path's rows out of training (seeded, after shuffling) in place of
    num_eval rows; num_eval of them are evaluated."""
    shuffle: bool = True
    """Train on path's rows in an order shuffled by the run's seed (the same in every process;
    another seed, another order), and hold out a seeded sample; false: file order, the first
    rows held out."""
    prompt_field: str = "prompt"
    """Field holding the prompt text in the prompt file."""
    answer_field: str = "answer"
    """Field holding the reference answer in the prompt file. A chat file without this field
    uses each row's final assistant message as the reference."""
    messages_field: str | None = None
    """Chat rows: the field holding each row's conversation, a list of {role, content}
    strings, in place of prompt_field. It is rendered through the tokenizer's chat template
    with the assistant's cue (needs model.chat_template: true); a final assistant message is
    not part of the prompt: it is the reference when the file has no answer_field, and what
    the supervised warm start teaches."""
    system_prompt: str | None = Field(None, min_length=1, max_length=100_000)
    """Chat rows: a system message put before each conversation that has none of its own."""
    show_work: bool = False
    """Arithmetic only: the answer is written out column by column with carries before the
    sum (a fixed number of tokens per answer); score it with verifier final_int."""
    verifier: Literal["exact_int", "final_int", "gsm8k", "math", "format"] = "exact_int"
    """Reward function applied to each completion (and the held-out accuracy's judge)."""
    reward: str | None = Field(None, pattern=USER_FUNCTION)
    """Your own reward, `module:function` (importable where the reward workers run), in place
    of `verifier` for training and for the held-out score. It is called with the arguments it
    names: `completion`, `answer`, `prompt`, `row` (the data row, every field) and `turns` (an
    episode's, else []), and returns a float or a dict of named float components (each logged;
    summed, or weighted by reward_weights). It may be `async def`. See docs/own-model.md."""
    reward_weights: dict[str, float] | None = None
    """Weights of a reward's named components (a missing name weighs 1); null: their sum."""
    reward_batched: bool = False
    """task.reward takes a group at once: each argument it names is a list (one entry per
    completion), and it returns a list of floats or of component dicts."""
    reward_timeout_s: float = Field(30.0, gt=0, le=3600)
    """A call of task.reward (or of a whole batch) that runs longer is cut: its completions
    score 0 and it is counted (`reward_timeout`)."""
    judge: JudgeConfig | None = None
    """A generative judge: a local causal LM the reward workers prompt with a template; the
    score parsed from its answer, times its weight, is added to the reward (component `judge`)."""
    reward_model: str | None = None
    """A local Hugging Face reward model (sequence classification, one label) the reward workers
    run on each (prompt, completion): its score times reward_model_weight is added to the
    training reward."""
    reward_model_weight: float = Field(1.0, gt=0, le=1e6)
    """Scale of the reward model's score in the training reward."""
    reward_model_only: bool = False
    """Train on the reward model's score alone (no verifier or task.reward term)."""
    prompt_template: str | None = Field(None, min_length=1, max_length=10_000)
    """Wrap each prompt in words of your own: a Python format string. Arithmetic offers {a} and
    {b} (the operands as the prompt writes them: "What is {a}+{b}? Answer with the number
    only."); prompt files offer every field of a row ("{question}"). None: the prompt as it is
    (`a+b=`, or the file's prompt_field)."""

    @model_validator(mode="after")
    def _fields_agree(self) -> TaskConfig:
        if self.reward_model_only and self.reward_model is None:
            raise FieldConflict(("reward_model_only", "reward_model"), "reward_model_only needs a reward_model")
        if self.prompt_template is not None:
            names = template_fields(self.prompt_template)
            unknown = names - {"a", "b"}
            if self.kind == "arithmetic" and unknown:
                raise FieldConflict(
                    ("prompt_template", "kind"),
                    "arithmetic prompts offer {a} and {b}, not "
                    + ", ".join("{" + name + "}" for name in sorted(unknown)),
                )
        if self.kind != "arithmetic" and self.path is None:
            raise FieldConflict(("kind", "path"), f"kind {self.kind} reads prompts from path; set it")
        if self.kind == "arithmetic" and self.path is not None:
            raise FieldConflict(("kind", "path"), "kind arithmetic ignores path; set kind file")
        if self.show_work and self.kind != "arithmetic":
            raise FieldConflict(("show_work", "kind"), f"show_work applies to kind arithmetic only, not {self.kind}")
        if self.show_work and self.operation != "+":
            raise FieldConflict(("show_work", "operation"), "worked answers are written for addition only")
        if self.show_work and self.verifier == "exact_int":
            raise FieldConflict(
                ("show_work", "verifier"),
                "verifier exact_int scores 0 on worked answers; use final_int",
            )
        num_pairs = (10**self.num_digits) ** 2
        if self.kind == "arithmetic" and self.num_eval * 4 > num_pairs:
            raise FieldConflict(
                ("num_eval", "num_digits"),
                f"{self.num_eval} held out of {num_pairs} pairs leaves too few to train on (at most {num_pairs // 4})",
            )
        return self

    @model_validator(mode="after")
    def _data_fields_agree(self) -> TaskConfig:
        if self.kind == "arithmetic":
            for name in DATA_FIELDS:
                if getattr(self, name) is not None:
                    raise FieldConflict((name, "kind"), f"{name} applies to data files, not kind arithmetic")
        if self.format is not None and self.kind != "file":
            raise FieldConflict(
                ("format", "kind"),
                f"kind {self.kind} is a format itself; set kind file to name one",
            )
        if self.eval_fraction is not None and (self.eval_path or self.eval_split):
            held = "eval_path" if self.eval_path else "eval_split"
            raise FieldConflict(("eval_fraction", held), f"the held-out rows come from {held}; set one of the two")
        if self.eval_split is not None and self.eval_path is None and self.eval_split == self.split:
            raise FieldConflict(("eval_split", "split"), f"{self.split} is the training split; hold out another")
        if self.system_prompt is not None and self.messages_field is None:
            raise FieldConflict(
                ("system_prompt", "messages_field"),
                "system_prompt is put before chat rows; set messages_field",
            )
        if self.messages_field is not None and self.prompt_template is not None:
            raise FieldConflict(
                ("prompt_template", "messages_field"),
                "a chat row's prompt is its messages; prompt_template words plain prompts only",
            )
        return self


class JudgeConfig(_Section):
    """A causal LM that grades each completion: its greedy answer to `template` must hold a
    number, which is divided by `max_score` (so 0..1) and times `weight` is the judge's part of
    the reward. An answer with no number scores 0 and is counted (`judge_unparsed`)."""

    model: str = Field(min_length=1)
    """Local Hugging Face causal-LM directory (or a hub id already in the local cache)."""
    template: str = Field(
        "Question: {prompt}\nReference answer: {answer}\nStudent answer: {completion}\n"
        "Grade the student answer from 0 (wrong) to 10 (right). Reply with the grade only.\n"
        "Grade:",
        min_length=1,
        max_length=20_000,
    )
    """The judge's prompt: a format string over {prompt}, {completion}, {answer} and the row's
    fields."""
    chat_template: bool = False
    """Wrap the judge's prompt in its tokenizer's chat template (instruct judges)."""
    max_new_tokens: int = Field(8, ge=1, le=4096)
    """Longest judge answer."""
    max_score: float = Field(10.0, gt=0, le=1e6)
    """The grade that means fully right; grades are clipped to 0..max_score."""
    weight: float = Field(1.0, gt=0, le=1e6)
    """Scale of the judge's 0..1 score in the reward."""
    only: bool = False
    """Train on the judge's score alone (no verifier or task.reward term)."""

    @model_validator(mode="after")
    def _template_fields(self) -> JudgeConfig:
        try:
            template_fields(self.template)
        except ValueError as err:  # its messages name the task's prompt_template
            raise ValueError(str(err).replace("prompt_template", "template", 1)) from None
        return self
