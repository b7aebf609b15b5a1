"""A user's own reward function, named in the config as `task.reward: module:function`.

The function is called with the arguments its signature names, out of `completion`, `answer`,
`prompt`, `row` (the data row the prompt came from, every field) and `turns` (an episode's
turns, else []); one that takes `**kwargs` gets them all, and one whose parameters have other
names gets (completion, answer) by position. It returns a float, or a dict of named float
components: each is logged on its own (`reward/<name>`), and the reward is their sum, or their
weighted sum (`task.reward_weights`). It may be `async def` (a group's calls are awaited at
once), or batched (`task.reward_batched`: every argument a list, one entry per completion, and
a list back).

It is imported where the reward workers run (installed, or on PYTHONPATH or the working
directory), checked before a run starts (`check_reward`: it is imported and called on a
training row, and one that returns what is not a number or a dict of numbers is refused), and
guarded like the built-in verifiers: a call that raises or returns something else scores 0.0
and is counted (`reward_error`), and a call past `task.reward_timeout_s` is cut, scores 0.0
and is counted (`reward_timeout`), never taking the worker down.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from llamarl.config import TaskConfig
from llamarl.errors import ConfigError
from llamarl.protocol import trainable_reward
from llamarl.rewards.deadline import EventLoop, RewardTimeout, call_within
from llamarl.user_code import load_function

log = structlog.get_logger(__name__)
ARGUMENTS = ("completion", "answer", "prompt", "row", "turns")
"""What a reward function may name."""
Problem = Callable[[str, str], None]
"""Told (reason, detail) of each call that failed or was cut."""


@dataclass(frozen=True)
class Sample:
    """One completion and what it answers."""

    completion: str
    answer: str
    prompt: str = ""
    row: Mapping[str, Any] = field(default_factory=dict)
    turns: Sequence[Any] = ()


@dataclass(frozen=True)
class Outcome:
    """A completion's reward and its named components ({} for a plain float)."""

    total: float
    components: dict[str, float] = field(default_factory=dict)


FAILED = Outcome(0.0)


class BadReturn(ValueError):
    """A reward function returned what is neither a finite number nor a dict of them."""


def outcome_of(value: Any, weights: Mapping[str, float] | None) -> Outcome:
    """What a reward function's return value means; BadReturn when it means nothing."""
    if isinstance(value, dict):
        components = {}
        for name, part in value.items():
            if not isinstance(name, str):
                raise BadReturn(f"a component named {name!r}, not by a string")
            components[name] = _number(part, f"component {name!r}: ")
        weights = weights or {}
        total = sum(weights.get(name, 1.0) * part for name, part in components.items())
        return Outcome(_number(total, "weighted total: "), components)
    return Outcome(_number(value))


def _number(value: Any, what: str = "") -> float:
    if isinstance(value, str) or not isinstance(value, int | float):
        raise BadReturn(f"{what}a {type(value).__name__}, not a number")
    if not trainable_reward(value):  # NaN, an infinity, past float32's range (1e300, 10**400)
        raise BadReturn(f"{what}{value!r:.40}, not a number finite as float32 (rewards train as float32)")
    return float(value)


class UserReward:
    """`task.reward`, ready to score samples (see the module docstring)."""

    def __init__(self, task: TaskConfig, on_problem: Problem | None = None) -> None:
        assert task.reward is not None
        self.spec = task.reward
        hint = "name one that takes (completion, answer) and returns a float"
        function = load_function(task.reward, "task.reward", hint)
        self.function = function
        self.names = _argument_names(function, task.reward)
        self.is_async = inspect.iscoroutinefunction(function)
        self.loop = EventLoop.shared() if self.is_async else None
        self.batched = task.reward_batched
        self.timeout_s = task.reward_timeout_s
        self.weights = task.reward_weights
        self.on_problem = on_problem or (lambda reason, detail: None)

    def _arguments(self, samples: Sequence[Sample]) -> tuple[list[Any], dict[str, Any]]:
        """The call's positional and keyword arguments: each sample's, or (batched) lists."""

        def value(name: str) -> Any:
            each = [_plain(name, getattr(s, name)) for s in samples]
            return each if self.batched else each[0]

        if self.names is None:
            return [value("completion"), value("answer")], {}
        return [], {name: value(name) for name in self.names}

    def score(self, samples: Sequence[Sample]) -> list[Outcome]:
        """Each sample's outcome; FAILED for one whose call failed or was cut (counted)."""
        if self.batched:
            return self._score_batch(samples)
        if self.loop is not None:
            calls = [self._async_call([s]) for s in samples]
            results = self.loop.await_all(self.timeout_s, calls)
            return [self._settle(result, 1)[0] for result in results]
        return [self._settle(self._sync_call([s]), 1)[0] for s in samples]

    def _score_batch(self, samples: Sequence[Sample]) -> list[Outcome]:
        if self.loop is not None:
            result = self.loop.await_all(self.timeout_s, [self._async_call(samples)])[0]
        else:
            result = self._sync_call(samples)
        return self._settle(result, len(samples))

    def _sync_call(self, samples: Sequence[Sample]) -> Any:
        args, kwargs = self._arguments(samples)
        try:
            return call_within(self.timeout_s, lambda: self.function(*args, **kwargs))
        except (Exception, RewardTimeout) as err:  # user code: counted, never fatal
            return err

    def _async_call(self, samples: Sequence[Sample]) -> Callable[[], Any]:
        args, kwargs = self._arguments(samples)
        return lambda: self.function(*args, **kwargs)

    def _settle(self, result: Any, count: int) -> list[Outcome]:
        """The outcomes a call's result (or the exception it raised) gives `count` samples."""
        if isinstance(result, RewardTimeout):
            log.warning("reward cut", reward=self.spec, timeout_s=self.timeout_s)
            self.on_problem("reward_timeout", f"{self.spec}: past {self.timeout_s:g} s")
            return [FAILED] * count
        if isinstance(result, BaseException):
            self._failed(f"raised {type(result).__name__}: {result}")
            return [FAILED] * count
        values = result if self.batched else [result]
        if self.batched and (not isinstance(values, list) or len(values) != count):
            self._failed(f"returned {type(result).__name__}, not a list of {count}")
            return [FAILED] * count
        outcomes = []
        for value in values:
            try:
                outcomes.append(outcome_of(value, self.weights))
            except BadReturn as err:
                self._failed(f"returned {err}")
                outcomes.append(FAILED)
        return outcomes

    def _failed(self, detail: str) -> None:
        log.warning("reward failed", reward=self.spec, error=detail[:200])
        self.on_problem("reward_error", f"{self.spec}: {detail[:200]}")


def _plain(name: str, value: Any) -> Any:
    """An argument as the function gets it: a row as a dict, turns as a list."""
    if name == "row":
        return dict(value)
    if name == "turns":
        return list(value)
    return value


def _argument_names(function: Callable[..., Any], spec: str) -> tuple[str, ...] | None:
    """The arguments `function` names (every one for **kwargs); None: (completion, answer)
    by position."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return ARGUMENTS
    named = tuple(p.name for p in parameters if p.name in ARGUMENTS)
    if named:
        return named
    kinds = [p.kind for p in parameters]
    by_position = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if sum(kind in by_position for kind in kinds) < 2 and inspect.Parameter.VAR_POSITIONAL not in kinds:
        raise ConfigError(
            f"task.reward {spec}: takes none of {', '.join(ARGUMENTS)}; name the arguments it "
            "needs (for example def reward(completion, answer, row))"
        )
    return None


def check_reward(task: TaskConfig, sample: Sample, where: str) -> None:
    """ConfigError naming `where` (the data row) unless task.reward, called on `sample` (the
    row's reference answer as the completion), returns a number or a dict of numbers."""
    reward = UserReward(task)
    args, kwargs = reward._arguments([sample])
    try:
        value = call_within(reward.timeout_s, lambda: reward.function(*args, **kwargs))
        if reward.loop is not None:
            value = reward.loop.await_all(reward.timeout_s, [lambda: value])[0]
            if isinstance(value, BaseException):
                raise value
        if reward.batched and not (isinstance(value, list) and len(value) == 1):
            raise BadReturn(f"a {type(value).__name__}, not a list of one (task.reward_batched)")
        values = value if reward.batched else [value]
        for each in values:
            outcome_of(each, reward.weights)
    except BadReturn as err:
        raise ConfigError(
            f"task.reward {task.reward} returned {err} for {where}; return a float or a dict of named floats"
        ) from None
    except RewardTimeout:
        raise ConfigError(
            f"task.reward {task.reward} took longer than task.reward_timeout_s ({task.reward_timeout_s:g} s) on {where}"
        ) from None
    except Exception as err:  # user code failing on a real row: worth a line before anything starts
        raise ConfigError(f"task.reward {task.reward}: raised {type(err).__name__} on {where} ({err})") from None
