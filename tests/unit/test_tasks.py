"""Prompt sources: seeded arithmetic with a disjoint held-out set, JSONL and Parquet files
(the other formats, shuffling, held-out sources and chat rows: test_data_files.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llamarl.config import TaskConfig, load_config
from llamarl.rewards import make_verifier
from llamarl.tasks import make_prompt_set
from llamarl.tasks.arithmetic import ArithmeticTask, worked_length, worked_sum

REPO = Path(__file__).resolve().parents[2]


def test_arithmetic_is_seeded_and_held_out_is_disjoint() -> None:
    task = ArithmeticTask(num_digits=2, num_eval=200, seed=3)
    held = {e.prompt for e in task.eval_items()}
    train = [task.train_item(i) for i in range(3000)]
    assert len(held) == 200
    assert not held & {e.prompt for e in train}
    assert task.train_item(17) == ArithmeticTask(2, 200, 3).train_item(17)
    assert task.train_item(17) != ArithmeticTask(2, 200, 4).train_item(17)
    a, b = train[0].prompt.rstrip("=").split("+")
    assert int(train[0].answer) == int(a) + int(b)
    assert train[0].row == {"a": int(a), "b": int(b), "answer": train[0].answer}


def test_jsonl_and_parquet_with_custom_fields(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "solution": f"#### {i}"} for i in range(10)]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for kind, path in (("jsonl", jsonl), ("parquet", parquet)):
        config = TaskConfig(
            kind=kind,
            path=str(path),
            prompt_field="question",
            answer_field="solution",
            num_eval=3,
            verifier="gsm8k",
            shuffle=False,
        )
        prompts = make_prompt_set(config, seed=0)
        assert [e.prompt for e in prompts.eval_items()] == ["q0", "q1", "q2"]
        assert prompts.train_item(0).prompt == "q3" and prompts.train_item(7).prompt == "q3"
        assert prompts.train_item(1).answer == "#### 4"


def test_prompt_file_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl: not readable as json"):
        make_prompt_set(TaskConfig(kind="jsonl", path=str(bad), num_eval=1), 0)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match="row 1 lacks"):
        make_prompt_set(TaskConfig(kind="jsonl", path=str(missing), num_eval=1), 0)


def test_prompt_template_words_arithmetic_and_file_prompts(tmp_path: Path) -> None:
    template = "What is {a}+{b}? Answer with the number only."
    worded = make_prompt_set(TaskConfig(num_eval=20, prompt_template=template), seed=0)
    plain = make_prompt_set(TaskConfig(num_eval=20), seed=0)
    for mine, theirs in zip(worded.eval_items(), plain.eval_items(), strict=True):
        a, b = theirs.prompt.rstrip("=").split("+")
        assert mine.prompt == template.format(a=a, b=b) and mine.answer == theirs.answer
    assert worded.train_item(5).answer == plain.train_item(5).answer
    rows = [{"question": f"q{i}", "topic": "sums", "answer": str(i)} for i in range(4)]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = TaskConfig(
        kind="jsonl",
        path=str(path),
        num_eval=1,
        prompt_template="{topic}: {question}",
        shuffle=False,
    )
    assert make_prompt_set(config, 0).train_item(0).prompt == "sums: q1"
    with pytest.raises(ValueError, match="no field 'level' that task.prompt_template names"):
        make_prompt_set(config.model_copy(update={"prompt_template": "{level} {question}"}), 0)


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{a} plus {c}", "offer {a} and {b}, not {c}"),
        ("{} + {}", "is not a field name"),
        ("{a + {b}", "not a format string: unexpected '{'"),
    ],
)
def test_bad_arithmetic_prompt_templates_are_refused(template: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        TaskConfig(prompt_template=template)


def test_worked_answers_have_one_length_and_carry_correctly() -> None:
    task = ArithmeticTask(num_digits=3, num_eval=50, seed=0, show_work=True)
    assert worked_sum(347, 85, 3) == "7+5+0=12 4+8+1=13 3+0+1=04 =0432"
    assert worked_sum(999, 999, 3).endswith("9+9+1=19 =1998")
    examples = [task.train_item(i) for i in range(500)] + task.eval_items()
    assert {len(e.solution or "") for e in examples} == {worked_length(3)}
    for example in examples:
        a, b = (int(x) for x in example.prompt.rstrip("=").split("+"))
        assert example.prompt == f"{a:03d}+{b:03d}="
        assert int(example.answer) == a + b
        assert example.target == example.solution and example.solution.endswith(f"={a + b:04d}")
    plain = ArithmeticTask(num_digits=3, num_eval=50, seed=0).train_item(0)
    assert plain.solution is None and plain.target == plain.answer


@pytest.mark.parametrize("name", ["gsm8k_smollm2", "math_smollm2"])
def test_shipped_sample_prompt_sets_load_and_their_references_score_one(name: str) -> None:
    config = load_config(REPO / "configs" / f"{name}.yaml")
    task = config.task.model_copy(update={"path": str(REPO / str(config.task.path))})
    prompts = make_prompt_set(task, seed=0)
    verifier = make_verifier(task.verifier)
    examples = [*prompts.eval_items(), *(prompts.train_item(i) for i in range(8))]
    assert len(examples) == 12 and len({e.prompt for e in examples}) == 12
    assert all(verifier(e.answer, e.answer) == 1.0 for e in examples)
    assert verifier("I do not know.", examples[0].answer) == 0.0
