"""A user's own data (`kind: file`): every format, a seeded shuffle, held-out rows that training
never sees, chat rows rendered through a real tokenizer's chat template, rows read lazily from
Arrow, and bad data refused in one line naming the file and the row."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from llamarl.config import ModelConfig, TaskConfig, parse_config
from llamarl.engine.model import build_policy, make_policy, save_policy
from llamarl.errors import ConfigError
from llamarl.tasks import DataError, make_prompt_set
from llamarl.tasks.files import FilePromptSet

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _file_set(path: Path, seed: int = 0, **task: Any) -> FilePromptSet:
    config = TaskConfig(kind="file", path=str(path), prompt_field="question", **task)
    prompt_set = make_prompt_set(config, seed)
    assert isinstance(prompt_set, FilePromptSet)
    return prompt_set


def _train_prompts(prompt_set: FilePromptSet, count: int | None = None) -> list[str]:
    count = len(prompt_set.train_order) if count is None else count
    return [prompt_set.train_item(i).prompt for i in range(count)]


def _formats(tmp: Path) -> dict[str, Path]:
    table = pa.Table.from_pylist(ROWS)
    pq.write_table(table, tmp / "p.parquet")
    pacsv.write_csv(table, tmp / "p.csv")
    (tmp / "p.json").write_text(json.dumps(ROWS))
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp / "saved"))
    splits = {"train": ROWS, "test": [{"question": "t", "answer": "0"}]}
    datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(
        str(tmp / "saved_dict")
    )
    return {
        "jsonl": _jsonl(tmp / "p.jsonl", ROWS),
        "json": tmp / "p.json",
        "parquet": tmp / "p.parquet",
        "csv": tmp / "p.csv",
        "save_to_disk": tmp / "saved",
        "DatasetDict.save_to_disk": tmp / "saved_dict",
    }


def test_every_format_loads_in_file_order(tmp_path: Path) -> None:
    for name, path in _formats(tmp_path).items():
        prompt_set = _file_set(path, num_eval=2, shuffle=False)
        held = prompt_set.eval_items()
        assert [(e.prompt, e.answer) for e in held] == [("q0", "0"), ("q1", "1")], name
        assert _train_prompts(prompt_set, 9) == [f"q{i}" for i in range(2, 10)] + ["q2"], name
        assert prompt_set.train_item(0).row["question"] == "q2", name  # CSV: answer an int
    odd = tmp_path / "p.data"
    odd.write_text((tmp_path / "p.jsonl").read_text())
    assert _file_set(odd, num_eval=2, format="json").train_item(0).answer in "23456789"
    with pytest.raises(DataError, match=r"p\.data: no format known for extension '\.data'"):
        _file_set(odd, num_eval=2)


def test_the_shuffle_is_the_seeds_alone(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [{"question": f"q{i}", "answer": "1"} for i in range(50)])
    first, again, other = (_file_set(path, seed, num_eval=5) for seed in (7, 7, 8))
    train = _train_prompts(first)
    held = [e.prompt for e in first.eval_items()]
    assert train == _train_prompts(again) and held == [e.prompt for e in again.eval_items()]
    assert train != _train_prompts(other) and held != [e.prompt for e in other.eval_items()]
    assert len(set(train)) == 45 and not set(train) & set(held)
    assert set(train) | set(held) == {f"q{i}" for i in range(50)}
    assert train != sorted(train, key=lambda p: int(p[1:])), "shuffled, not file order"


def test_held_out_rows_are_never_trained_on(tmp_path: Path) -> None:
    splits = {
        "train": [{"question": f"train{i}", "answer": "1"} for i in range(20)],
        "test": [{"question": f"test{i}", "answer": "1"} for i in range(8)],
    }
    directory = tmp_path / "dict"
    datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(
        str(directory)
    )
    by_split = _file_set(directory, num_eval=5, eval_split="test")
    assert set(_train_prompts(by_split)) == {r["question"] for r in splits["train"]}
    held = {e.prompt for e in by_split.eval_items()}
    assert len(held) == 5 and held <= {r["question"] for r in splits["test"]}

    other = _jsonl(tmp_path / "eval.jsonl", splits["test"])
    train = _jsonl(tmp_path / "train.jsonl", splits["train"])
    by_file = _file_set(train, num_eval=100, eval_path=str(other))
    assert set(_train_prompts(by_file)) == {r["question"] for r in splits["train"]}
    assert {e.prompt for e in by_file.eval_items()} == {r["question"] for r in splits["test"]}

    rows = [{"question": f"q{i}", "answer": "1"} for i in range(50)]
    by_fraction = _file_set(_jsonl(tmp_path / "all.jsonl", rows), num_eval=4, eval_fraction=0.2)
    trained = set(_train_prompts(by_fraction))
    evaluated = {e.prompt for e in by_fraction.eval_items()}
    assert len(trained) == 40 and len(evaluated) == 4 and not trained & evaluated


def _chat_model(directory: Path) -> Path:
    """A tiny model whose tokenizer (one token a character) has a chat template."""
    policy = build_policy(
        ModelConfig(
            hidden_size=16,
            num_layers=1,
            num_heads=2,
            intermediate_size=32,
            extra_characters=string.ascii_letters + "[].?",
        ),
        seed=0,
    )
    policy.tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    save_policy(policy, directory)
    return directory


def test_chat_rows_render_through_the_tokenizers_chat_template(tmp_path: Path) -> None:
    """The whole conversation up to the final reply, through the chat template saved with the
    model, with the assistant's cue; the final reply is the answer (no answer field here)."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": "What is one plus one?"},
                {"role": "assistant", "content": "two"},
            ],
            "level": 1,
        },
        {
            "messages": [
                {"role": "system", "content": "Be exact."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Yo"},
                {"role": "user", "content": "Why?"},
                {"role": "assistant", "content": "Because"},
            ],
            "level": 2,
        },
    ]
    path = _jsonl(tmp_path / "chat.jsonl", rows * 2)
    task = TaskConfig(
        kind="file",
        path=str(path),
        messages_field="messages",
        num_eval=1,
        shuffle=False,
        system_prompt="Be brief.",
    )
    policy = make_policy(ModelConfig(path=str(_chat_model(tmp_path / "m")), chat_template=True), 0)
    prompt_set = make_prompt_set(task, seed=0)
    first, second = prompt_set.train_item(1), prompt_set.train_item(0)
    assert (first.prompt, first.answer, first.row["level"]) == ("What is one plus one?", "two", 1)
    assert first.solution is None and first.target == "two"
    rendered = "[system]Be brief.[user]What is one plus one?[assistant]"
    ids = policy.encode_example(first)
    assert ids == policy.tokenizer(rendered, add_special_tokens=False).input_ids
    assert policy.tokenizer.decode(ids) == rendered
    # The row's own system message stays (system_prompt is for rows without one), and so does
    # a reply before the last user turn.
    assert (second.prompt, second.answer) == ("Why?", "Because")
    assert policy.tokenizer.decode(policy.encode_example(second)) == (
        "[system]Be exact.[user]Hi[assistant]Yo[user]Why?[assistant]"
    )
    assert policy.encode_example(second) != policy.encode_prompt(second.prompt)


def test_chat_rows_take_their_answer_from_the_answer_field_when_there_is_one(
    tmp_path: Path,
) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"worked {i}"},
            ],
            "answer": str(i),
        }
        for i in range(3)
    ]
    task = TaskConfig(
        kind="file",
        path=str(_jsonl(tmp_path / "c.jsonl", rows)),
        messages_field="messages",
        num_eval=1,
        shuffle=False,
    )
    example = make_prompt_set(task, seed=0).train_item(0)
    assert (example.answer, example.solution, example.target) == ("1", "worked 1", "worked 1")
    assert example.messages == ({"role": "user", "content": "q1"},)


def test_chat_rows_need_a_chat_template() -> None:
    chat = {"kind": "file", "path": "chat.jsonl", "messages_field": "messages"}
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "task.messages_field, model.path: chat rows need a chat template and the built "
            "model's character tokenizer has none"
        ),
    ):
        parse_config({"task": chat}, environ={})
    with pytest.raises(ConfigError, match="set model.chat_template: true"):
        parse_config({"task": chat, "model": {"path": "m"}}, environ={})


def test_rows_are_read_lazily_from_memory_mapped_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The set holds the Arrow dataset and reads a row when asked; the check never copies
    the file into Python objects (iterating or converting the whole dataset fails here)."""
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(5000)]
    chat = [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": "1"} for i in range(3000)]
    for name in ("__iter__", "to_list", "to_pandas", "to_dict"):
        monkeypatch.setattr(datasets.Dataset, name, _refuse)
    plain = _file_set(_jsonl(tmp_path / "p.jsonl", rows), num_eval=10)
    chat_set = make_prompt_set(
        TaskConfig(
            kind="file",
            path=str(_jsonl(tmp_path / "c.jsonl", chat)),
            messages_field="messages",
            num_eval=10,
        ),
        0,
    )
    for prompt_set in (plain, chat_set):
        assert isinstance(prompt_set, FilePromptSet)
        assert isinstance(prompt_set.train_rows, datasets.Dataset)
        assert prompt_set.train_rows.cache_files, "memory-mapped from the datasets cache"
        assert prompt_set.train_item(123).prompt.startswith("q")
    assert len(plain.train_order) == 4990 and len(plain.eval_items()) == 10


def _refuse(*_: object, **__: object) -> None:
    raise AssertionError("the whole dataset was copied into Python objects")


def _bad(tmp: Path, rows: list[object] | str, name: str = "bad.jsonl", **task: Any) -> TaskConfig:
    path = tmp / name
    path.write_text(rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows))
    return TaskConfig(kind="file", path=str(path), **({"num_eval": 1} | task))


def _chat(tmp: Path, *conversations: object, answer: bool = True) -> TaskConfig:
    rows = [{"messages": c} | ({"answer": "1"} if answer else {}) for c in conversations]
    return _bad(tmp, rows, messages_field="messages")


GOOD = {"prompt": "p", "answer": "1"}
TALK = [{"role": "user", "content": "hi"}]
NOT_MESSAGES = "'messages' is not a list of {role, content} strings"


@dataclass(frozen=True)
class Bad:
    case: str
    config: Callable[[Path], TaskConfig]
    line: str
    """The error's start, the test's directory written TMP."""


BAD_DATA = [
    Bad(
        "a null answer",
        lambda t: _bad(t, [GOOD, GOOD, {"prompt": "p"}]),
        "task.path TMP/bad.jsonl: row 3 lacks 'answer'",
    ),
    Bad(
        "an empty prompt (the character model would be given no token)",
        lambda t: _bad(t, [GOOD, {"prompt": "", "answer": "1"}]),
        "task.path TMP/bad.jsonl: row 2 has an empty 'prompt'",
    ),
    Bad(
        "no answer field at all",
        lambda t: _bad(t, [{"prompt": "p"}] * 3),
        "task.path TMP/bad.jsonl: row 1 lacks 'answer' (its fields: prompt)",
    ),
    Bad(
        "an empty file",
        lambda t: _bad(t, ""),
        "task.path TMP/bad.jsonl: no rows (the file is empty)",
    ),
    Bad(
        "a CSV header alone",
        lambda t: _bad(t, "prompt,answer\n", "bad.csv"),
        "task.path TMP/bad.csv: no rows",
    ),
    Bad(
        "no training rows left",
        lambda t: _bad(t, [GOOD] * 3, num_eval=3),
        "task.path TMP/bad.jsonl: 3 rows leave none for training after 3 held out",
    ),
    Bad(
        "a conversation that is a string",
        lambda t: _chat(t, TALK, "hi"),
        f"task.path TMP/bad.jsonl: row 2 {NOT_MESSAGES}",
    ),
    Bad(
        "a message without content",
        lambda t: _chat(t, TALK, TALK, [{"role": "user"}]),
        f"task.path TMP/bad.jsonl: row 3 {NOT_MESSAGES}",
    ),
    Bad(
        "a message whose content is a number",
        lambda t: _chat(t, [{"role": "user", "content": 3}], TALK),
        f"task.path TMP/bad.jsonl: row 1 {NOT_MESSAGES}",
    ),
    Bad(
        "a conversation with only a reply",
        lambda t: _chat(t, TALK, [{"role": "assistant", "content": "x"}]),
        "task.path TMP/bad.jsonl: row 2 'messages' holds no prompt (no message before the final assistant reply)",
    ),
    Bad(
        "chat rows with no answer anywhere",
        lambda t: _chat(t, TALK, TALK, answer=False),
        "task.path TMP/bad.jsonl: row 1 lacks 'answer', and its 'messages' has no final "
        "assistant reply to take as the answer",
    ),
    Bad(
        "chat rows not named",
        lambda t: _bad(t, [{"messages": TALK, "answer": "1"}] * 2),
        "task.path TMP/bad.jsonl: row 1 lacks 'prompt' (its fields: answer, messages; chat "
        "rows: set task.messages_field: messages)",
    ),
    Bad(
        "a missing file",
        lambda t: TaskConfig(kind="file", path=str(t / "none.jsonl")),
        "task.path TMP/none.jsonl: no such file or directory",
    ),
    Bad(
        "a directory that is no dataset",
        lambda t: TaskConfig(kind="file", path=str(t)),
        "task.path TMP: a directory, but not one that Dataset.save_to_disk or DatasetDict.save_to_disk wrote",
    ),
    Bad(
        "a held-out split of a plain file",
        lambda t: _bad(t, [GOOD] * 3, eval_split="test"),
        "task.eval_split test: task.path TMP/bad.jsonl has no splits (it is not a DatasetDict directory)",
    ),
    Bad(
        "a bad row in eval_path",
        lambda t: _bad(t, [GOOD] * 3, eval_path=str(_bad(t, [GOOD, {"prompt": "p"}], "held.jsonl").path)),
        "task.eval_path TMP/held.jsonl: row 2 lacks 'answer'",
    ),
]


@pytest.mark.parametrize("bad", BAD_DATA, ids=[b.case for b in BAD_DATA])
def test_bad_data_is_one_line_naming_the_file_and_the_row(bad: Bad, tmp_path: Path) -> None:
    with pytest.raises(DataError) as raised:
        make_prompt_set(bad.config(tmp_path), seed=0)
    message = str(raised.value).replace(str(tmp_path), "TMP")
    assert "\n" not in message and message.startswith(bad.line), message
    assert isinstance(raised.value, ConfigError), "a config error: one line and exit code 2"


def test_empty_and_missing_splits_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "dict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([GOOD] * 3),
            "test": datasets.Dataset.from_dict({"prompt": [], "answer": []}),
        }
    ).save_to_disk(str(directory))
    config = TaskConfig(kind="file", path=str(directory), num_eval=1)
    with pytest.raises(DataError, match=r"dict \(split test\): no rows$"):
        make_prompt_set(config.model_copy(update={"eval_split": "test"}), 0)
    with pytest.raises(DataError, match=r"dict: no split 'dev' \(its splits: test, train\)$"):
        make_prompt_set(config.model_copy(update={"split": "dev"}), 0)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (
            {"kind": "arithmetic", "path": None, "eval_fraction": 0.1},
            "eval_fraction applies to data files, not kind arithmetic",
        ),
        ({"eval_fraction": 0.1, "eval_path": "e.jsonl"}, "the held-out rows come from eval_path"),
        ({"eval_split": "train"}, "train is the training split; hold out another"),
        ({"system_prompt": "Be brief."}, "system_prompt is put before chat rows"),
        ({"kind": "jsonl", "format": "csv"}, "kind jsonl is a format itself"),
        ({"messages_field": "m", "prompt_template": "{q}"}, "prompt_template words plain prompts"),
    ],
)
def test_data_fields_that_disagree_are_refused(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        TaskConfig.model_validate({"kind": "file", "path": "p.jsonl"} | fields)


def test_a_field_the_template_names_may_not_be_null(tmp_path: Path) -> None:
    rows = [{"q": "1+1", "answer": "2"}, {"q": "2+2", "answer": "4"}, {"q": None, "answer": "6"}]
    path = _jsonl(tmp_path / "nulls.jsonl", rows)
    with pytest.raises(DataError, match=r"nulls.jsonl: row 3 lacks 'q'"):
        _file_set(path, prompt_template="What is {q}?", num_eval=1)


def test_task_format_reads_only_files_whose_extension_does_not_say(tmp_path: Path) -> None:
    """format: csv names the format of a .txt file; the .parquet held-out file stays Parquet."""
    (tmp_path / "train.txt").write_text("question,answer\n1+1,2\n2+2,4\n3+3,6\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "held.parquet")
    prompt_set = _file_set(tmp_path / "train.txt", format="csv", eval_path=str(tmp_path / "held.parquet"))
    assert sorted(_train_prompts(prompt_set)) == ["1+1", "2+2", "3+3"]
    assert len(prompt_set.eval_items()) == len(ROWS)
