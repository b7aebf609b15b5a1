"""Splitting one machine's cores between the roles of a `llamarl run`.

Asynchronous RL wins by running roles side by side, so each role's speed at the threads it gets
is what overlaps. `llamarl run` gives the trainer and the generators shares of
`workers.num_cores` in proportion to their measured work: at launch it times one generation
batch (a few decode steps, scaled to `max_new_tokens`) and one training step on that batch, at
one thread each, and splits the cores by those times (`llamarl.sim.predict.split_cores`, the rule
the simulator predicts with: at least one thread per process; reward workers run one thread
each). When there is no choice to make (as many cores as trainer plus generators, or fewer)
nothing is measured and every process gets one thread. Explicit `workers.trainer_threads` /
`workers.generator_threads` override the split. When trainer and generators fit side by side,
each is pinned to cores of its own (`workers.pin_cores`). The synchronous baseline runs every
phase with all `num_cores` threads, so both modes use the same machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llamarl.config import RunConfig, WorkersConfig
from llamarl.sim.predict import split_cores

PROBE_TOKENS = 4


@dataclass(frozen=True)
class CoreSplit:
    trainer_threads: int
    generator_threads: int
    trainer_share: float | None
    """The measured share of the work that is training (None: nothing was measured)."""
    pins: dict[str, list[int]] = field(default_factory=dict)
    """worker id -> the cores it is pinned to (empty when the roles do not fit side by side)."""


def pin_cores(
    usable: list[int], trainer_threads: int, generator_threads: int, num_generators: int
) -> dict[str, list[int]]:
    """Disjoint cores for the trainer and each generator when they fit, else none: a role
    then keeps its own caches and never waits behind the other for a core. Reward workers,
    the broker and Redis are not pinned."""
    needed = trainer_threads + num_generators * generator_threads
    if needed > len(usable):
        return {}
    pins = {"trainer": usable[:trainer_threads]}
    for index in range(num_generators):
        start = trainer_threads + index * generator_threads
        pins[f"generator-{index}"] = usable[start : start + generator_threads]
    return pins


def role_threads(config: RunConfig, role: str) -> int:
    """torch threads for one process of `role`: the split's share (a trainer's divided between
    its ranks), one for the roles the split leaves out."""
    workers = config.workers
    threads = {"trainer": workers.trainer_threads, "generator": workers.generator_threads}.get(role) or 1
    return max(1, threads // config.trainer.ranks) if role == "trainer" else threads


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def set_affinity(pid: int, cores: list[int]) -> None:
    """Pin a process (and the threads it starts afterwards) to `cores`."""
    os.sched_setaffinity(pid, cores)


def encoded_prompts(config: RunConfig, policy: Any, count: int) -> list[list[int]]:
    """The first `count` training prompts of the config's task, encoded as a generator does."""
    from llamarl.tasks import make_prompt_set

    prompt_set = make_prompt_set(config.task, config.seed)
    return [policy.encode_example(prompt_set.train_item(i)) for i in range(count)]


def work_probes(config: RunConfig) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(generate, train): one generation batch of `probe` decode positions and one training
    step on full-length completions (a step's cost depends on shapes alone), as the roles run
    them, at the caller's threads."""
    import torch

    from llamarl.engine.grouped import TrainGroup
    from llamarl.engine.model import make_policy
    from llamarl.engine.sampling import sample
    from llamarl.training.learner import Learner

    gen = config.generation
    policy = make_policy(config.model, config.seed)
    prompts = encoded_prompts(config, policy, gen.prompts_per_batch)
    probe = min(PROBE_TOKENS, gen.max_new_tokens)

    def generate() -> Any:
        return sample(policy, prompts, num_samples=gen.num_samples, max_new_tokens=probe, min_new_tokens=probe)

    batch = generate()
    repeats = -(-gen.max_new_tokens // probe)
    completions = batch.completion_ids.repeat(1, repeats)[:, : gen.max_new_tokens]
    rows = gen.num_samples
    groups = [
        TrainGroup(
            prompt_ids=torch.tensor(prompt),
            completion_ids=completions[g * rows : (g + 1) * rows],
            completion_mask=torch.ones_like(completions[:rows]),
            behaviour_logprobs=torch.zeros(completions[:rows].shape),
            rewards=torch.arange(rows, dtype=torch.float32),
        )
        for g, prompt in enumerate(prompts)
    ]
    algorithm = config.algorithm.with_loss_constant(gen.max_new_tokens)
    learner = Learner(policy, algorithm, config.trainer, gen.temperature)
    return generate, lambda: learner.step(groups)


def measure_trainer_share(config: RunConfig) -> float:
    """Training's share of one step's work at one thread (launch-time calibration)."""
    import torch  # here, so the broker's and the light commands' start does not pay for it

    gen = config.generation
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generate, train = work_probes(config)
        started = time.perf_counter()
        generate()
        probe = min(PROBE_TOKENS, gen.max_new_tokens)
        generate_s = (time.perf_counter() - started) * gen.max_new_tokens / probe
        started = time.perf_counter()
        train()
        train_s = time.perf_counter() - started
        train_s *= config.trainer.prompts_per_step / gen.prompts_per_batch
    finally:
        torch.set_num_threads(threads)
    return train_s / (train_s + generate_s)


def plan_threads(config: RunConfig) -> CoreSplit:
    workers: WorkersConfig = config.workers
    num_cores = workers.num_cores or usable_cores()
    share: float | None = None
    trainer, generator = 1, 1
    if workers.trainer_threads is None or workers.generator_threads is None:
        if num_cores > workers.num_generators + 1:
            share = measure_trainer_share(config)
            trainer, generator = split_cores(num_cores, workers.num_generators, share)
    trainer = workers.trainer_threads or trainer
    generator = workers.generator_threads or generator
    usable = sorted(os.sched_getaffinity(0))[:num_cores]
    pins = pin_cores(usable, trainer, generator, workers.num_generators) if workers.pin_cores else {}
    return CoreSplit(trainer, generator, share, pins)
