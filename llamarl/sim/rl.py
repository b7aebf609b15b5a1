"""The simulated run: generators, reward workers and the trainer of an async run on a shared
CPU (`cpu.Cpu`), or the lock step of a sync run, charged the profile's costs.

Async follows the real roles: a generator pulls the newest published version before each batch,
claims up to prompts_per_batch tickets that the staleness gate allows (issued tickets at most
(trained steps + max_staleness + 1) x prompts_per_step), generates, and passes the groups to the
reward workers, which pass them to the trainer; the trainer trains on the oldest
prompts_per_step groups, drops (and reissues) any staler than the bound, stages the new version
and publishes it. Sync generates a step's prompts as one batch, scores and trains, one phase
after another on every core.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from llamarl.sim.costs import Costs, Lengths
from llamarl.sim.cpu import Cpu
from llamarl.store.interfaces import admission_bound

WARMUP_STEPS = 2
"""Steps left out of the step time (the pipeline filling)."""


@dataclass(frozen=True)
class Layout:
    cores: int
    num_generators: int
    generator_threads: int
    trainer_threads: int
    num_reward: int
    max_staleness: int
    prompts_per_step: int
    prompts_per_batch: int
    num_samples: int
    continuous: bool = False
    """Continuous batching: a batch's rows cost their own lengths, not its longest one's."""
    colocated: bool = False
    """Generation and training in turn on every core (one generator, max_staleness 0)."""

    def describe(self) -> str:
        if self.colocated:
            return f"colocated: generator and trainer in turn on {self.cores} thread(s) each"
        return (f"{self.num_generators} generator(s) x {self.generator_threads} thread(s), "
                f"trainer {self.trainer_threads} thread(s), max_staleness {self.max_staleness}")  # fmt: skip

    def generate_s(self, costs: Costs, threads: int, lengths: list[int]) -> float:
        """Seconds to decode a batch of completions of `lengths` alone at `threads`: static, it
        runs until its longest ends with every row in it; continuous, its rows keep the batch
        full, a decode step costing its fixed part once for every batch of rows."""
        at = costs.at(threads)
        if not self.continuous:
            return at.generate_s(len(lengths), max(lengths))
        total = sum(lengths)
        return at.decode_s * total / len(lengths) + at.decode_s_per_seq * total


@dataclass
class Prediction:
    mode: str
    s_per_step: float
    idle_fraction: dict[str, float]
    staleness: dict[int, int]
    dropped_stale: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "s_per_step": round(self.s_per_step, 4),
                "idle_fraction": {k: round(v, 3) for k, v in self.idle_fraction.items()},
                "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
                "dropped_stale": self.dropped_stale}  # fmt: skip


@dataclass
class _Group:
    ticket: int
    version: int
    tokens: int


@dataclass
class _Generator:
    name: str
    held: int = -1
    waiting: bool = False


@dataclass
class _AsyncRun:
    layout: Layout
    costs: Costs
    lengths: Lengths
    steps: int
    rng: random.Random
    cpu: Cpu = field(init=False)
    trained: int = 0
    issued: int = 0
    reissue: deque[int] = field(default_factory=deque)
    scoring: deque[_Group] = field(default_factory=deque)
    buffer: list[_Group] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    first_busy: dict[str, float] = field(default_factory=dict)
    staleness: Counter[int] = field(default_factory=Counter)
    dropped: int = 0

    def __post_init__(self) -> None:
        self.cpu = Cpu(self.layout.cores, self.costs.corun_slowdown,
                       self.costs.oversubscribed_slowdown)  # fmt: skip
        self.generators = [_Generator(f"generator-{i}") for i in range(self.layout.num_generators)]
        self.rewards = [f"reward-{i}" for i in range(self.layout.num_reward)]

    def _start(self, process: str, role: str, threads: int, work_s: float, done: Any) -> None:
        self.first_busy.setdefault(process, self.cpu.now)
        self.cpu.start(process, role, threads, work_s, done)

    # -- generators ------------------------------------------------------------------------
    def generator_next(self, gen: _Generator) -> None:
        if self.cpu.busy(gen.name) or self.trained >= self.steps:
            return
        gen.waiting = False
        layout = self.layout
        if self.trained > gen.held:
            version = self.trained

            def pulled() -> None:
                gen.held = version
                self.generator_next(gen)

            self._start(gen.name, "generate", layout.generator_threads, self.costs.pull_s, pulled)
            return
        limit = admission_bound(self.trained, layout.max_staleness, layout.prompts_per_step)
        tickets: list[int] = []
        while len(tickets) < layout.prompts_per_batch and self.reissue:
            tickets.append(self.reissue.popleft())
        while len(tickets) < layout.prompts_per_batch and self.issued < limit:
            tickets.append(self.issued)
            self.issued += 1
        if not tickets:
            gen.waiting = True
            return
        n = layout.num_samples
        lengths = self.lengths.draw(self.rng, len(tickets) * n)
        work = self.costs.jittered(
            self.rng, "generate", layout.generate_s(self.costs, layout.generator_threads, lengths)
        )
        prompt = self.costs.prompt_tokens
        groups = [
            _Group(t, gen.held, round(sum(lengths[i * n : (i + 1) * n]) + n * prompt))
            for i, t in enumerate(tickets)
        ]

        def generated() -> None:
            self.scoring.extend(groups)
            for reward in self.rewards:
                self.reward_next(reward)
            self.generator_next(gen)

        self._start(gen.name, "generate", layout.generator_threads, work, generated)

    # -- reward workers ----------------------------------------------------------------------
    def reward_next(self, reward: str) -> None:
        if self.cpu.busy(reward) or not self.scoring:
            return
        group = self.scoring.popleft()

        def scored() -> None:
            self.buffer.append(group)
            self.trainer_next()
            self.reward_next(reward)

        self._start(reward, "reward", 1, self.costs.score_s_per_group, scored)

    # -- trainer -------------------------------------------------------------------------------
    def trainer_next(self) -> None:
        layout = self.layout
        if self.cpu.busy("trainer") or self.trained >= self.steps:
            return
        fresh = []
        for group in self.buffer:
            if self.trained - group.version > layout.max_staleness:
                self.dropped += 1
                self.reissue.append(group.ticket)
            else:
                fresh.append(group)
        self.buffer = fresh
        if len(self.buffer) < layout.prompts_per_step:
            self._wake_generators()
            return
        batch, self.buffer = (
            self.buffer[: layout.prompts_per_step],
            self.buffer[layout.prompts_per_step :],
        )
        for group in batch:
            self.staleness[self.trained - group.version] += 1
        tokens = sum(g.tokens for g in batch)
        train = self.costs.at(layout.trainer_threads).step_train_s(tokens)
        work = self.costs.jittered(self.rng, "train", train) + self.costs.stage_s

        def trained() -> None:
            self.trained += 1
            self.step_ends.append(self.cpu.now)
            self._wake_generators()
            self.trainer_next()

        self._start("trainer", "train", layout.trainer_threads, work, trained)

    def _wake_generators(self) -> None:
        for gen in self.generators:
            if gen.waiting or not self.cpu.busy(gen.name):
                self.generator_next(gen)

    def run(self) -> Prediction:
        for gen in self.generators:
            self.generator_next(gen)
        while self.trained < self.steps:
            if not self.cpu.advance():
                raise RuntimeError(f"the simulated run stalled at step {self.trained}")
        end = self.cpu.now
        idle: dict[str, list[float]] = {}
        for process, first in self.first_busy.items():
            role = process.split("-")[0]
            window = end - first
            busy = min(self.cpu.busy_s.get(process, 0.0), window)
            idle.setdefault(role, []).append(1 - busy / window if window > 0 else 0.0)
        return Prediction(
            "async",
            step_time(self.step_ends),
            {role: sum(v) / len(v) for role, v in idle.items()},
            dict(self.staleness),
            self.dropped,
        )


def step_time(ends: list[float]) -> float:
    """Mean seconds between step ends, the first WARMUP_STEPS left out."""
    skip = min(WARMUP_STEPS, len(ends) - 2)
    return (ends[-1] - ends[skip]) / (len(ends) - 1 - skip)


def simulate_async(layout: Layout, costs: Costs, lengths: Lengths, steps: int,
                   seed: int = 0) -> Prediction:  # fmt: skip
    return _AsyncRun(layout, costs, lengths, steps, random.Random(seed)).run()


def simulate_sync(layout: Layout, costs: Costs, lengths: Lengths, steps: int,
                  seed: int = 0) -> Prediction:  # fmt: skip
    """Every phase on all `layout.cores` threads, one after another: the step's prompts
    decoded as one batch (as `llamarl run --mode sync` does), scored, trained, then the
    profile's handover of the weights to generation (none when the sync run shares its model).
    A colocated layout (`layout.colocated`) is predicted the same way, its generator a process
    of its own (without the sync process's slowdown) and each version staged and pulled."""
    rng = random.Random(seed)
    at = costs.at(layout.cores)
    sequences = layout.prompts_per_step * layout.num_samples
    totals = {"generate": 0.0, "score": 0.0, "train": 0.0, "handover": 0.0}
    ends, now = [], 0.0
    for _ in range(steps):
        drawn = lengths.draw(rng, sequences)
        decode = at.generate_s(sequences, max(drawn))
        if layout.continuous:  # a drained batch: rows leave as they end
            decode = max(drawn) * at.decode_s + sum(drawn) * at.decode_s_per_seq
        slowdown = 1.0 if layout.colocated else costs.sync_generate_slowdown
        totals["generate"] += decode * slowdown
        tokens = sum(drawn) + round(sequences * costs.prompt_tokens)
        totals["score"] += layout.prompts_per_step * costs.score_s_per_group
        totals["train"] += at.step_train_s(tokens)
        totals["handover"] += costs.stage_s + costs.pull_s if layout.colocated else costs.handover_s
        now = sum(totals.values())
        ends.append(now)
    total = sum(totals.values())
    idle = {phase: 1 - spent / total for phase, spent in totals.items()
            if spent or phase != "handover"}  # fmt: skip
    mode = "colocated" if layout.colocated else "sync"
    return Prediction(mode, step_time(ends), idle, {0: steps * layout.prompts_per_step})


def speedup(sync: Prediction, asynchronous: Prediction) -> float:
    return sync.s_per_step / asynchronous.s_per_step if asynchronous.s_per_step else math.inf
