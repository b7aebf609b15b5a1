"""What a profile measured, as costs the simulator charges: generation, scoring, training and
weight sync, each a function of the work and of the threads a role runs with."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llamarl.errors import ConfigError


@dataclass(frozen=True)
class ThreadCosts:
    """Costs at one thread count, alone on the machine."""

    decode_s: float
    """Seconds per decode position of a batch, fixed part."""
    decode_s_per_seq: float
    """Seconds per decode position per sequence in the batch."""
    train_s: float
    """Seconds per training step, fixed part."""
    train_s_per_token: float
    """Seconds per trained token (prompt and completion)."""

    def generate_s(self, sequences: int, longest: int) -> float:
        """A batch decodes until its longest completion ends."""
        return longest * (self.decode_s + self.decode_s_per_seq * sequences)

    def step_train_s(self, tokens: int) -> float:
        return self.train_s + self.train_s_per_token * tokens


@dataclass(frozen=True)
class Costs:
    threads: dict[int, ThreadCosts]
    score_s_per_group: float
    stage_s: float
    """Trainer seconds to stage a version for the sync channel (a copy of the weights)."""
    pull_s: float
    """Generator seconds to pull a version and load it."""
    prompt_tokens: float
    """Mean prompt tokens of the config's prompts."""
    corun_slowdown: dict[str, float]
    """Per role: its time while another process is busy / its time alone."""
    cores: int
    """Cores of the profiled machine."""
    oversubscribed_slowdown: float = 1.0
    """With more threads busy than cores: how much slower than a fair share each one runs."""
    jitter_cv: dict[str, float] = field(default_factory=dict)
    """Per role: coefficient of variation of one unit of its work from step to step (a batch,
    a training step); the simulator draws each duration around its mean with this spread."""
    sync_generate_slowdown: float = 1.0
    """A sync run's generation / a generator's alone, at the same batch and threads (the sync
    process also holds the trainer's model, gradients and optimizer)."""
    handover_s: float = 0.0
    """Seconds a sync step spends handing the trained weights to its generation engine: 0 for
    llamarl's sync mode (the same model in process); a gather-and-broadcast elsewhere."""
    completion_lengths: list[int] = field(default_factory=list)
    """Completion lengths the profile's model sampled (empty: not measured)."""
    turns_s_per_step: float = 0.0
    """Seconds a step of the one_process layout took, run for real (`llamarl.bench.turns_probe`;
    0: not measured)."""
    turns_phase_s: dict[str, float] = field(default_factory=dict)
    """The same steps' median seconds generating and training (`generate`, `train`; empty: not
    measured), what `llamarl.sim.calibrate` scales the cost lines to."""

    def jittered(self, rng: random.Random, role: str, seconds: float) -> float:
        """`seconds` scaled by a log-normal factor of mean 1 and the role's spread."""
        cv = self.jitter_cv.get(role, 0.0)
        if cv <= 0:
            return seconds
        sigma = math.sqrt(math.log(1 + cv * cv))
        return seconds * rng.lognormvariate(-sigma * sigma / 2, sigma)

    def at(self, threads: int) -> ThreadCosts:
        """The costs at `threads` (the nearest profiled count at or below it)."""
        known = [t for t in sorted(self.threads) if t <= threads] or [min(self.threads)]
        return self.threads[known[-1]]

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        tree = asdict(self) | {"threads": {str(t): asdict(c) for t, c in self.threads.items()}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(tree | extra, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Costs:
        try:
            tree = json.loads(path.read_text())
            return cls(
                threads={int(t): ThreadCosts(**c) for t, c in tree["threads"].items()},
                score_s_per_group=float(tree["score_s_per_group"]),
                stage_s=float(tree["stage_s"]),
                pull_s=float(tree["pull_s"]),
                prompt_tokens=float(tree["prompt_tokens"]),
                corun_slowdown={k: float(v) for k, v in tree["corun_slowdown"].items()},
                cores=int(tree["cores"]),
                oversubscribed_slowdown=float(tree.get("oversubscribed_slowdown", 1.0)),
                jitter_cv={k: float(v) for k, v in tree.get("jitter_cv", {}).items()},
                sync_generate_slowdown=float(tree.get("sync_generate_slowdown", 1.0)),
                handover_s=float(tree.get("handover_s", 0.0)),
                completion_lengths=[int(n) for n in tree.get("completion_lengths", [])],
                turns_s_per_step=float(tree.get("turns_s_per_step", 0.0)),
                turns_phase_s={k: float(v) for k, v in tree.get("turns_phase_s", {}).items()},
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(
                f"--profile {path}: not a profile ({type(err).__name__}: {err}); write one with "
                "`llamarl bench profile CONFIG --out FILE`"
            ) from None


@dataclass(frozen=True)
class Lengths:
    """Completion lengths in tokens: drawn from `observed` lengths when there are some, else
    all `median` (sigma 0), or log-normal with that median and sigma (a long tail), cut at
    `longest`."""

    longest: int
    median: float
    sigma: float = 0.0
    observed: tuple[int, ...] = ()

    def draw(self, rng: random.Random, count: int) -> list[int]:
        if self.observed:
            return [rng.choice(self.observed) for _ in range(count)]
        if self.sigma == 0:
            return [min(self.longest, max(1, round(self.median)))] * count
        mu = math.log(self.median)
        return [min(self.longest, max(1, round(rng.lognormvariate(mu, self.sigma)))) for _ in range(count)]
