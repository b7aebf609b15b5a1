"""What a run's data and its reward functions must pass before anything starts: every row of the
task's data and of each evaluation set's file is readable and has the fields the config names
(DataError naming the file and the row), and each reward function of the user's, called on the
first row it will score, returns a number or a dict of numbers (ConfigError naming the row)."""

from __future__ import annotations

from llamarl.config import RunConfig, TaskConfig
from llamarl.rewards.custom import Sample, check_reward
from llamarl.tasks import Example, make_prompt_set, read_examples


def check_data_and_rewards(config: RunConfig) -> None:
    task = config.task
    first = make_prompt_set(task, config.seed).train_item(0)
    if task.reward is not None:
        source = task.path or f"task {task.kind}"
        _probe(task, first, f"the first training row of {source}")
    for each in config.evaluation.sets:
        field = f"evaluation.sets.{each.name}.path"
        examples = read_examples(each.path, task, field, each.max_prompts)
        reward = each.reward if each.verifier is None else None
        if reward is None and each.verifier is None:
            reward = task.reward
        if reward is not None:
            _probe(task.model_copy(update={"reward": reward}), examples[0], f"row 1 of {each.path}")


def _probe(task: TaskConfig, example: Example, where: str) -> None:
    """check_reward on `example`, its reference answer as the completion."""
    where = f"{where} (prompt {example.prompt[:60]!r})"
    sample = Sample(example.answer, example.answer, example.prompt, example.row)
    check_reward(task, sample, where)
