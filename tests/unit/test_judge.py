"""A generative judge as the reward role's scorer (`task.judge`): real tiny causal LMs saved to
disk and loaded from their directories. A judge whose weights are set so that greedy decoding
always writes one token makes its answers, and so the reward arithmetic, exact; a random one
checks the shape of what comes back and the left-padded batch."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from llamarl.config import JudgeConfig, parse_config
from llamarl.engine.tokenizer import build_char_tokenizer
from llamarl.errors import ConfigError
from llamarl.launch.local import preflight
from llamarl.protocol import RolloutGroup, TypedArray
from llamarl.rewards.judge import JudgeScorer, check_judge, grade
from llamarl.rewards.scorers import VerifierScorer
from llamarl.rewards.verifiers import exact_int
from tests.factories import rollout_group
from tests.tiny_llama import tiny_llama_config

CHARACTERS = "0123456789+-*= " + string.ascii_letters + ".:,()?!'/|<>\n"
COMPLETIONS = ["46", "47 is my answer", "forty-six, I think"]


def save_judge(directory: Path, says: str | None = None, chat_template: str | None = None) -> Path:
    """A tiny Llama judge; with `says` (one character, or "<eos>"), greedy decoding writes that
    token at every step: each position's hidden state is the same constant and only its row of
    the output layer is non-zero."""
    tokenizer = build_char_tokenizer(CHARACTERS)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config = tiny_llama_config(tokenizer, 512, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if says is not None:
        with torch.no_grad():
            model.model.embed_tokens.weight.fill_(1.0)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.lm_head.weight.zero_()
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(says)] = 1.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def group_of(completions: list[str], prompt_index: int = 3) -> RolloutGroup:
    group = rollout_group(ticket_id=prompt_index, num_samples=len(completions))
    data = np.frombuffer("\0".join(completions).encode(), dtype=np.uint8)
    return type(group)(**{**group.__dict__, "completions": TypedArray.from_numpy(data)})


class Problems:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, reason: str, detail: str) -> None:
        self.seen.append((reason, detail))

    def reasons(self) -> list[str]:
        return [reason for reason, _ in self.seen]


def exact_int_base() -> VerifierScorer:
    return VerifierScorer(exact_int, "exact_int")


@pytest.mark.parametrize(
    ("answer", "max_score", "expected"),
    [
        ("7", 10.0, 0.7),
        (" Grade: 8/10", 10.0, 0.8),
        ("12", 10.0, 1.0),
        ("-3", 10.0, 0.0),
        ("2.5 of 5", 5.0, 0.5),
        ("7.5.3", 10.0, 0.75),
        ("0", 10.0, 0.0),
        ("no grade", 10.0, None),
        ("", 10.0, None),
    ],
)
def test_grade_is_the_first_number_clipped_and_divided_by_max_score(
    answer: str, max_score: float, expected: float | None
) -> None:
    value = grade(answer, max_score)
    assert value == (None if expected is None else pytest.approx(expected))


def test_a_judge_that_says_7_adds_weight_times_0_7_to_the_base(tmp_path: Path) -> None:
    directory = save_judge(tmp_path / "sevens", says="7")
    config = JudgeConfig(model=str(directory), max_new_tokens=1, weight=2.0)
    problems = Problems()
    scorer = JudgeScorer(config, exact_int_base(), None, problems)
    scores = scorer.score(group_of(COMPLETIONS))
    assert scores.rewards.dtype == np.float32
    np.testing.assert_allclose(scores.rewards, 1.4 + np.array([1.0, 0.0, 0.0]), rtol=1e-6)
    assert scores.components == pytest.approx({"judge": 1.4, "exact_int": 1 / 3})
    assert scorer.name == "judge:sevens+exact_int"
    assert problems.seen == []


def test_a_grade_above_max_score_is_clipped_and_only_drops_the_base(tmp_path: Path) -> None:
    directory = save_judge(tmp_path / "sevens", says="7")
    config = JudgeConfig(model=str(directory), max_new_tokens=2, weight=3.0, only=True)
    scorer = JudgeScorer(config, exact_int_base(), None, None)
    assert scorer.answers(["Grade:"]) == ["77"]
    scores = scorer.score(group_of(COMPLETIONS))
    np.testing.assert_allclose(scores.rewards, [3.0, 3.0, 3.0])
    assert scores.components == pytest.approx({"judge": 3.0})
    assert scorer.name == "judge:sevens"


@pytest.mark.parametrize("says", ["x", "<eos>"])
def test_an_answer_with_no_number_scores_0_and_is_counted(tmp_path: Path, says: str) -> None:
    directory = save_judge(tmp_path / "judge", says=says)
    problems = Problems()
    scorer = JudgeScorer(JudgeConfig(model=str(directory), max_new_tokens=3), None, None, problems)
    scores = scorer.score(group_of(COMPLETIONS))
    np.testing.assert_array_equal(scores.rewards, [0.0, 0.0, 0.0])
    assert problems.reasons() == ["judge_unparsed"] * len(COMPLETIONS)


def test_a_random_judge_scores_each_completion_within_0_and_weight(tmp_path: Path) -> None:
    directory = save_judge(tmp_path / "random")
    config = JudgeConfig(model=str(directory), max_new_tokens=4, weight=2.0)
    problems = Problems()
    scorer = JudgeScorer(config, exact_int_base(), None, problems)
    group = group_of(COMPLETIONS)
    judge = scorer.judge_scores(group)
    assert judge.shape == (len(COMPLETIONS),) and judge.dtype == np.float32
    assert ((judge >= 0) & (judge <= 1)).all()
    answers = scorer.answers(scorer.judge_prompts(group, COMPLETIONS) or [])
    grades = [grade(answer, config.max_score) for answer in answers]
    np.testing.assert_allclose(judge, [value or 0.0 for value in grades])
    assert problems.reasons() == ["judge_unparsed"] * grades.count(None)
    scores = scorer.score(group)
    np.testing.assert_allclose(scores.rewards, 2.0 * judge + np.array([1.0, 0.0, 0.0]), rtol=1e-6)
    assert set(scores.components) == {"judge", "exact_int"}


def test_a_group_decoded_in_one_left_padded_batch_matches_each_prompt_alone(
    tmp_path: Path,
) -> None:
    config = JudgeConfig(model=str(save_judge(tmp_path / "random")), max_new_tokens=6)
    scorer = JudgeScorer(config, None)
    prompts = ["1+1=", "What is 12+34? Grade:", "a much longer question than the others: 7"]
    batched = scorer.answers(prompts)
    assert batched == [scorer.answers([prompt])[0] for prompt in prompts]
    assert any(batched), "the random judge writes something"


def test_the_template_reads_the_row_and_the_group_fields_win(tmp_path: Path) -> None:
    directory = save_judge(tmp_path / "judge", says="5")
    config = JudgeConfig(model=str(directory), template="{question}|{answer}|{completion}")
    rows = {3: {"question": "Q3", "answer": "the row's answer"}}
    scorer = JudgeScorer(config, None, rows.__getitem__)
    group = group_of(["46", "47"], prompt_index=3)
    assert scorer.judge_prompts(group, ["46", "47"]) == ["Q3|46|46", "Q3|46|47"]


def test_a_row_without_a_template_field_scores_0_and_is_counted(tmp_path: Path) -> None:
    directory = save_judge(tmp_path / "judge", says="9")
    config = JudgeConfig(model=str(directory), template="{question} {completion}")
    problems = Problems()
    scorer = JudgeScorer(config, exact_int_base(), lambda index: {}, problems)
    scores = scorer.score(group_of(COMPLETIONS))
    np.testing.assert_array_equal(scores.rewards, [1.0, 0.0, 0.0])
    assert scores.components["judge"] == 0.0
    assert problems.reasons() == ["judge_error"]
    assert "'question'" in problems.seen[0][1]


def test_a_failed_generation_scores_0_and_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = save_judge(tmp_path / "judge", says="9")
    problems = Problems()
    scorer = JudgeScorer(JudgeConfig(model=str(directory)), exact_int_base(), None, problems)

    def broken(**kwargs: object) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(scorer.model, "generate", broken)
    scores = scorer.score(group_of(COMPLETIONS))
    np.testing.assert_array_equal(scores.rewards, [1.0, 0.0, 0.0])
    assert problems.reasons() == ["judge_error"]
    assert "RuntimeError: out of memory" in problems.seen[0][1]


def test_the_chat_template_wraps_the_prompt_as_a_user_turn(tmp_path: Path) -> None:
    chat = (
        "{% for m in messages %}<{{ m['role'] }}|{{ m['content'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant|{% endif %}"
    )
    directory = save_judge(tmp_path / "chat", says="6", chat_template=chat)
    config = JudgeConfig(model=str(directory), chat_template=True, max_new_tokens=1)
    scorer = JudgeScorer(config, None)
    assert scorer.model_texts(["Grade 46"]) == ["<user|Grade 46><assistant|"]
    np.testing.assert_allclose(scorer.score(group_of(COMPLETIONS)).rewards, [0.6] * 3, rtol=1e-6)
    plain = save_judge(tmp_path / "plain", says="6")
    with pytest.raises(ConfigError, match="task.judge.chat_template: the tokenizer of .* has none"):
        JudgeScorer(JudgeConfig(model=str(plain), chat_template=True), None)


def test_a_row_field_is_refused_at_start_where_there_is_no_row(tmp_path: Path) -> None:
    directory = save_judge(tmp_path / "judge", says="5")
    config = JudgeConfig(model=str(directory), template="{question} {completion}")
    with pytest.raises(ConfigError, match=r"task.judge.template: \{question\} needs a data row"):
        JudgeScorer(config, None, None)


def test_bad_judge_models_are_refused_before_a_run_and_when_loaded(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing")
    with pytest.raises(ConfigError, match="task.judge.model .*nothing: not a local model") as err:
        check_judge(JudgeConfig(model=missing))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="task.judge.model .*nothing: not a local model"):
        preflight(parse_config({"task": {"judge": {"model": missing}}}), "sync")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="task.judge.model .*broken: not a loadable") as err:
        JudgeScorer(JudgeConfig(model=str(broken)), None)
    assert "\n" not in str(err.value)
