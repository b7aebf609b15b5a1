"""The simulated run: generators, reward workers and the trainer of an async run on a shared
CPU (`cpu.Cpu`), or the lock step of a sync run, charged the profile's costs.

Async follows the real roles: a generator pulls the newest published version before each batch,
claims up to prompts_per_batch tickets that the staleness gate allows (issued tickets at most
(trained steps + max_staleness + 1) x prompts_per_step), generates, and passes the groups to the
reward workers, which pass them to the trainer; the trainer trains on the oldest
prompts_per_step groups (padded as its micro-batches are), drops (and reissues) any staler than
the bound, stages the new version and publishes it. With continuous batching a generator
instead decodes its running batch (`sim.running`) one position at a time, claiming tickets as
places free up and taking up new versions between steps (or once drained, without in-flight
updates). Sync generates a step's prompts as one batch, scores and trains, one phase after
another on every core.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from llamarl.sim.costs import Costs, Lengths
from llamarl.sim.cpu import Cpu
from llamarl.sim.running import RunningBatch
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
    """Continuous batching: a generator decodes a running batch one position at a time, rows
    leaving as they end and groups joining as places free up (`sim.running`)."""
    inflight_updates: bool = True
    """With continuous batching: a new version is taken up between two decode steps (else
    once the running batch has drained)."""
    colocated: bool = False
    """Generation and training in turn on every core (one generator, max_staleness 0)."""
    micro_batch_tokens: int = 4096
    """The trainer's micro-batch size in tokens: each micro-batch is padded to its longest."""

    def describe(self) -> str:
        if self.colocated:
            return f"colocated: generator and trainer in turn on {self.cores} thread(s) each"
        return (
            f"{self.num_generators} generator(s) x {self.generator_threads} thread(s), "
            f"trainer {self.trainer_threads} thread(s), max_staleness {self.max_staleness}"
        )

    def generate_s(self, costs: Costs, threads: int, lengths: list[int]) -> float:
        """Seconds to decode a static batch of completions of `lengths` alone at `threads`: it
        runs until its longest ends with every row in it."""
        return costs.at(threads).generate_s(len(lengths), max(lengths))


@dataclass
class Prediction:
    mode: str
    s_per_step: float
    idle_fraction: dict[str, float]
    staleness: dict[int, int]
    dropped_stale: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "s_per_step": round(self.s_per_step, 4),
            "idle_fraction": {k: round(v, 3) for k, v in self.idle_fraction.items()},
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
            "dropped_stale": self.dropped_stale,
        }


def trained_tokens(widths: list[int], rows: int, prompt: float, max_tokens: int) -> int:
    """Prompt and completion tokens a training step passes, padding included: its groups
    (`rows` completions each, the longest `widths`) sorted by width and cut into micro-batches
    of at most `max_tokens`, each padded to its longest completion, as the trainer cuts them
    (`engine.grouped.micro_batches`, all prompts taken as one length)."""
    total, tokens, rows_in, width = 0.0, 0.0, 0, 0
    for width_next in sorted(widths):
        cost = rows * (prompt + width_next)
        if rows_in and tokens + cost > max_tokens:
            total += rows_in * (prompt + width)
            tokens, rows_in = 0.0, 0
        width, tokens, rows_in = width_next, tokens + cost, rows_in + rows
    return round(total + rows_in * (prompt + width))


@dataclass
class _Group:
    ticket: int
    version: int
    width: int
    """Its longest completion."""


@dataclass
class _Generator:
    name: str
    held: int = -1
    waiting: bool = False
    batch: RunningBatch | None = None
    """The running batch, with continuous batching."""
    pace: float = 1.0
    """The jitter factor of its decode steps, drawn when groups join."""


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
        self.cpu = Cpu(self.layout.cores, self.costs.corun_slowdown, self.costs.oversubscribed_slowdown)
        running = self.layout.continuous
        self.generators = [
            _Generator(f"generator-{i}", batch=RunningBatch(self.layout.num_samples) if running else None)
            for i in range(self.layout.num_generators)
        ]
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
        drained = gen.batch is None or not gen.batch.rows()
        if self.trained > gen.held and (drained or layout.inflight_updates):
            version = self.trained

            def pulled() -> None:
                gen.held = version
                if gen.batch is not None:
                    gen.batch.restart_older_than(version - layout.max_staleness, version)
                self.generator_next(gen)

            self._start(gen.name, "generate", layout.generator_threads, self.costs.pull_s, pulled)
            return
        if gen.batch is not None:
            self._decode_step(gen, gen.batch, claim=self.trained <= gen.held)
            return
        tickets = self._claim(layout.prompts_per_batch)
        if not tickets:
            gen.waiting = True
            return
        n = layout.num_samples
        lengths = self.lengths.draw(self.rng, len(tickets) * n)
        work = self.costs.jittered(
            self.rng, "generate", layout.generate_s(self.costs, layout.generator_threads, lengths)
        )
        groups = [_Group(t, gen.held, max(lengths[i * n : (i + 1) * n])) for i, t in enumerate(tickets)]
        self._start(gen.name, "generate", layout.generator_threads, work, lambda: self._generated(gen, groups))

    def _claim(self, count: int) -> list[int]:
        """Up to `count` tickets: reissued ones first, then new ones the staleness gate lets
        out."""
        limit = admission_bound(self.trained, self.layout.max_staleness, self.layout.prompts_per_step)
        tickets: list[int] = []
        while len(tickets) < count and self.reissue:
            tickets.append(self.reissue.popleft())
        while len(tickets) < count and self.issued < limit:
            tickets.append(self.issued)
            self.issued += 1
        return tickets

    def _decode_step(self, gen: _Generator, batch: RunningBatch, claim: bool) -> None:
        """One decode step of the running batch, after claiming its free places (`claim`:
        not while a version waits for the batch to drain)."""
        layout = self.layout
        tickets = self._claim(batch.free_groups(layout.prompts_per_batch)) if claim else []
        for ticket in tickets:
            batch.admit(ticket, gen.held, self.lengths.draw(self.rng, layout.num_samples))
        if tickets:
            gen.pace = self.costs.jittered(self.rng, "generate", 1.0)
        if not batch.rows():
            gen.waiting = True
            return
        at = self.costs.at(layout.generator_threads)
        work = (at.decode_s + at.decode_s_per_seq * batch.rows()) * gen.pace

        def decoded() -> None:
            ended = batch.step()
            self._generated(gen, [_Group(g.ticket, g.version, max(g.lengths)) for g in ended])

        self._start(gen.name, "generate", layout.generator_threads, work, decoded)

    def _generated(self, gen: _Generator, groups: list[_Group]) -> None:
        self.scoring.extend(groups)
        for reward in self.rewards:
            self.reward_next(reward)
        self.generator_next(gen)

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
        tokens = trained_tokens(
            [g.width for g in batch], layout.num_samples, self.costs.prompt_tokens, layout.micro_batch_tokens
        )
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


def simulate_async(layout: Layout, costs: Costs, lengths: Lengths, steps: int, seed: int = 0) -> Prediction:
    return _AsyncRun(layout, costs, lengths, steps, random.Random(seed)).run()


def simulate_sync(layout: Layout, costs: Costs, lengths: Lengths, steps: int, seed: int = 0) -> Prediction:
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
        n = layout.num_samples
        widths = [max(drawn[i : i + n]) for i in range(0, sequences, n)]
        tokens = trained_tokens(widths, n, costs.prompt_tokens, layout.micro_batch_tokens)
        totals["score"] += layout.prompts_per_step * costs.score_s_per_group
        totals["train"] += at.step_train_s(tokens)
        totals["handover"] += costs.stage_s + costs.pull_s if layout.colocated else costs.handover_s
        now = sum(totals.values())
        ends.append(now)
    total = sum(totals.values())
    idle = {phase: 1 - spent / total for phase, spent in totals.items() if spent or phase != "handover"}
    mode = "colocated" if layout.colocated else "sync"
    return Prediction(mode, step_time(ends), idle, {0: steps * layout.prompts_per_step})


def speedup(sync: Prediction, asynchronous: Prediction) -> float:
    return sync.s_per_step / asynchronous.s_per_step if asynchronous.s_per_step else math.inf
