"""The user's own reward (`task.reward`): it sees the prompt, the data row and an episode's
turns, returns a float or named components (logged, summed or weighted), may be async or
batched, is cut at its timeout and counted, and one that returns nonsense is refused before a
run starts."""

from __future__ import annotations

import json
import math
import threading
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamarl.config import parse_config
from llamarl.engine.rollouts import component_means, score_group
from llamarl.errors import ConfigError
from llamarl.launch.data_checks import check_data_and_rewards
from llamarl.launch.sync_run import run_sync
from llamarl.rewards.custom import Sample, UserReward
from llamarl.rewards.scorers import SampleScorer
from llamarl.tasks import Example
from llamarl.training.eval_sets import pass_at_k
from tests.factories import rollout_group

MODEL = {
    "hidden_size": 16,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
}


def _task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, **fields: Any) -> Any:
    """A task config whose reward is `module:reward`, `source` written to tmp_path/module.py."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = {"kind": "arithmetic", "num_digits": 1, "num_eval": 4, "reward": f"{module}:reward"}
    return parse_config({"task": tree | fields, "model": MODEL}).task


def _problems() -> tuple[list[tuple[str, str]], Any]:
    seen: list[tuple[str, str]] = []
    return seen, lambda reason, detail: seen.append((reason, detail))


def test_a_reward_reading_a_row_field_and_returning_components_is_scored_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "def reward(completion, row, prompt):\n"
        "    right = float(completion.strip() == str(row['a'] + row['b']))\n"
        "    return {'right': right, 'short': 1.0 / (1 + len(completion)), 'has_a': float(str(row['a']) in prompt)}\n"
    )
    task = _task(tmp_path, monkeypatch, "row_reward", source, reward_weights={"short": 0.5})
    example = Example(7, "3+4=", "7", row={"a": 3, "b": 4, "answer": "7"})
    scorer = SampleScorer(UserReward(task), lambda index: example)
    group = rollout_group(ticket_id=7)  # completions "46" and "47"
    scored = score_group(group, scorer)
    # The row says 3+4: neither completion is right, whatever the group's own answer (46) says.
    assert scored.components == {"right": 0.0, "short": pytest.approx(1 / 3), "has_a": 1.0}
    assert scored.rewards.to_numpy().tolist() == pytest.approx([0.5 / 3 + 1.0] * 2)
    assert component_means([scored, scored]) == {
        "reward/has_a": 1.0,
        "reward/right": 0.0,
        "reward/short": pytest.approx(1 / 3),
    }
    # A prompt that does not hold row['a']: has_a is 0; "46" is right for 40+6.
    right = Example(7, "4+6=", "10", row={"a": 40, "b": 6})
    assert SampleScorer(UserReward(task)).score_texts(right, ["46", "7"], [[], []]) == [
        pytest.approx(1.0 + 0.5 / 3),
        pytest.approx(0.5 / 2),
    ]


def test_components_are_logged_in_a_runs_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = (
        "def reward(completion, answer, row):\n"
        "    return {'sum_known': float(row['a'] + row['b'] == int(answer)), 'zero': 0.0}\n"
    )
    task = _task(tmp_path, monkeypatch, "run_reward", source)
    config = parse_config(
        {
            "run_id": "rewards",
            "run_dir": str(tmp_path / "run"),
            "model": MODEL,
            "task": task.model_dump(),
            "generation": {"num_samples": 2, "max_new_tokens": 3},
            "trainer": {"prompts_per_step": 2, "num_steps": 2, "eval_every": 2, "sft_steps": 0},
        }
    )
    summary = run_sync(config)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["reward/sum_known"] for r in records] == [1.0, 1.0]
    assert [r["reward/zero"] for r in records] == [0.0, 0.0]
    assert [r["reward_mean"] for r in records] == [1.0, 1.0]
    # The held-out score is the reward's too (its row is the held-out example's).
    assert summary["final_accuracy"] == 1.0


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_slow_reward_is_cut_at_its_timeout_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_thread: bool
) -> None:
    source = (
        "import time\ndef reward(completion):\n    if completion == 'slow':\n        time.sleep(30)\n    return 1.0\n"
    )
    task = _task(tmp_path, monkeypatch, f"slow_reward_{in_thread}", source, reward_timeout_s=0.3)
    seen, on_problem = _problems()
    reward = UserReward(task, on_problem)
    outcomes: list[Any] = []
    started = time.monotonic()
    samples = [Sample("slow", "1"), Sample("fast", "1")]
    if in_thread:  # not the main thread: given up on at the deadline
        thread = threading.Thread(target=lambda: outcomes.extend(reward.score(samples)))
        thread.start()
        thread.join(10)
    else:  # the main thread: cut by SIGALRM
        outcomes = reward.score(samples)
    assert time.monotonic() - started < 5
    assert [o.total for o in outcomes] == [0.0, 1.0]
    assert [reason for reason, _ in seen] == ["reward_timeout"]


def test_an_async_reward_is_awaited_at_once_and_cut_at_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import asyncio\n"
        "async def reward(completion, answer):\n"
        "    await asyncio.sleep(30 if completion == 'slow' else 0.2)\n"
        "    return float(completion == answer)\n"
    )
    task = _task(tmp_path, monkeypatch, "async_reward", source, reward_timeout_s=1.0)
    seen, on_problem = _problems()
    started = time.monotonic()
    samples = [Sample("7", "7"), Sample("slow", "7")] + [Sample("6", "7")] * 4
    outcomes = UserReward(task, on_problem).score(samples)
    assert time.monotonic() - started < 2.5, "six 0.2 s calls and a cut one, awaited at once"
    assert [o.total for o in outcomes] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [reason for reason, _ in seen] == ["reward_timeout"]


def test_a_batched_reward_gets_lists_and_a_wrong_answer_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = (
        "CALLS = []\n"
        "def reward(completion, answer):\n"
        "    CALLS.append(len(completion))\n"
        "    if completion[0] == 'bad':\n"
        "        return 'not a list'\n"
        "    return [float(c == a) for c, a in zip(completion, answer)]\n"
    )
    task = _task(tmp_path, monkeypatch, "batch_reward", source, reward_batched=True)
    seen, on_problem = _problems()
    reward = UserReward(task, on_problem)
    assert [o.total for o in reward.score([Sample("1", "1"), Sample("2", "1")])] == [1.0, 0.0]
    assert [o.total for o in reward.score([Sample("bad", "1"), Sample("1", "1")])] == [0.0, 0.0]
    assert reward.function.__globals__["CALLS"] == [2, 2], "one call a batch"
    assert [reason for reason, _ in seen] == ["reward_error"]


def test_a_reward_returning_nonsense_scores_zero_and_is_counted_and_refused_before_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "def reward(completion, answer):\n"
        "    big = {'1e300': {'huge': 1e300}, 'int': 10**400, 'sum': {'a': 3e38, 'b': 3e38}}\n"
        "    return {'': float('nan'), **big}.get(completion, 'yes')\n"
    )
    task = _task(tmp_path, monkeypatch, "string_reward", source)
    seen, on_problem = _problems()
    samples = [Sample(text, "1") for text in ("x", "", "1e300", "int", "sum")]
    outcomes = UserReward(task, on_problem).score(samples)
    assert [o.total for o in outcomes] == [0.0] * 5
    assert [reason for reason, _ in seen] == ["reward_error"] * 5
    assert "returned a str, not a number" in seen[0][1] and "returned nan" in seen[1][1]
    # Past float32's range, where the trainer would read an infinity: a number, an int too large
    # for a float, and a weighted total of two parts that fit.
    assert "returned component 'huge': 1e+300, not a number finite as float32" in seen[2][1]
    assert "returned 10000000000" in seen[3][1] and "returned weighted total: 6e+38" in seen[4][1]
    config = parse_config({"task": task.model_dump(), "model": MODEL})
    with pytest.raises(ConfigError) as refused:
        check_data_and_rewards(config)
    line = str(refused.value)
    assert "\n" not in line and "first training row of task arithmetic (prompt " in line
    assert "task.reward string_reward:reward returned a str, not a number for " in line


def test_a_reward_naming_no_argument_it_could_get_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task(tmp_path, monkeypatch, "odd_reward", "def reward(text):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="takes none of completion, answer, prompt, row, turns"):
        UserReward(task)


def test_pass_at_k_matches_a_hand_computation() -> None:
    # 5 samples, 2 solved, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    # Against every way of drawing k of the n samples.
    for n, c in ((6, 2), (8, 3), (5, 1)):
        solved = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            draws = list(combinations(solved, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, draws)) / len(draws))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    assert math.isclose(pass_at_k(10, 3, 10), 1.0)
    assert np.isfinite(pass_at_k(200, 1, 100))


def test_a_reward_that_catches_everything_or_cancels_alarms_is_still_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import signal, time\n"
        "def reward(completion):\n"
        "    signal.alarm(0)\n"  # a library cancelling alarms
        "    for _ in range(300):\n"
        "        try:\n"
        "            time.sleep(0.1)\n"
        "        except Exception:\n"  # a grader that swallows every error
        "            pass\n"
        "    return 1.0\n"
    )
    task = _task(tmp_path, monkeypatch, "stubborn_reward", source, reward_timeout_s=0.3)
    seen, on_problem = _problems()
    started = time.monotonic()
    assert [o.total for o in UserReward(task, on_problem).score([Sample("x", "1")])] == [0.0]
    assert time.monotonic() - started < 5
    assert [reason for reason, _ in seen] == ["reward_timeout"]


def test_async_rewards_share_one_event_loop_for_state_bound_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import asyncio\n"
        "LIMIT = None\n"
        "async def reward(completion):\n"
        "    global LIMIT\n"
        "    LIMIT = LIMIT or asyncio.Semaphore(2)\n"
        "    async with LIMIT:\n"
        "        await asyncio.sleep(0.01)\n"
        "    return 1.0\n"
    )
    task = _task(tmp_path, monkeypatch, "bound_reward", source)
    seen, on_problem = _problems()
    for _ in range(2):  # a second scorer of the same process (held-out, an evaluation set)
        outcomes = UserReward(task, on_problem).score([Sample("x", "1")] * 4)
        assert [o.total for o in outcomes] == [1.0] * 4
    assert seen == []


def test_a_batched_reward_returning_a_float_is_refused_before_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = "def reward(completion):\n    return 1.0\n"
    task = _task(tmp_path, monkeypatch, "scalar_batch", source, reward_batched=True)
    config = parse_config({"task": task.model_dump(), "model": MODEL})
    with pytest.raises(ConfigError, match="returned a float, not a list of one"):
        check_data_and_rewards(config)
