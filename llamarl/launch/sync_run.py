"""The synchronous baseline: the same generator, reward scorer and trainer components as an async
run, placed in one process and run in lock step: generate a step's prompts -> score -> train ->
publish, one version at a time (staleness 0).

A step whose groups the trainer skipped (dynamic sampling, `sampling.dynamic_sampling`, as often
as its cap on draws allows; or an episode's environment raised) is followed by another batch for
the missing ones.

Only the placement differs from an async run: the store is a `MemoryStore`, the bus a `MemoryHub`,
and the weight transport the in-process one (the generator samples with the trainer's own model),
which is what `llamarl bench async-vs-sync` compares. A sync run keeps no Redis ledger and cannot
be resumed, so it writes no checkpoints: it is the benchmarks' baseline, and `llamarl run` says so
as it starts (`workers.layout: auto` never chooses it; it takes turns in the colocated layout).
Writes RUN_DIR/metrics.jsonl (with each step's phase seconds: generate_s, score_s, train_s,
step_s) and returns the run summary, with the in-memory ledger and the refusals counted by
reason, as an async run's has them.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

from llamarl.bus import Bus, MemoryHub
from llamarl.config import LocalSync, RunConfig
from llamarl.errors import ConfigError, SyncError
from llamarl.launch.cores import usable_cores
from llamarl.launch.local import prepare_run_dir
from llamarl.launch.startup import startup_summary
from llamarl.observe.progress import Progress
from llamarl.roles import build
from llamarl.roles.generator import Generator
from llamarl.roles.reward import RewardScorer
from llamarl.roles.runtime import RoleRuntime
from llamarl.roles.trainer import Trainer
from llamarl.store import MemoryStore
from llamarl.weightsync import make_publisher, make_receiver

WAIT_MS = 100
"""Wait for the trainer's new version to be announced (it is one thread away), between checks
that the publisher thread has not failed."""


def lock_step_config(config: RunConfig) -> RunConfig:
    """The run's config for lock step: no lag, one claim per step, the in-process transport, no
    checkpoints."""
    pps = config.trainer.prompts_per_step
    sync = config.sync.model_dump(include=set(LocalSync.model_fields) - {"transport"})
    return config.model_copy(
        update={
            "staleness": config.staleness.model_copy(update={"max_staleness": 0}),
            "generation": config.generation.model_copy(update={"prompts_per_batch": pps}),
            "trainer": config.trainer.model_copy(update={"checkpoint_every": 0}),
            "sync": LocalSync(**sync),
        }
    )


def _generate(generator: Generator, trainer: Trainer, timeout_s: float) -> None:
    """One step's batch, once the trainer's newest version has been taken up."""
    deadline = time.monotonic() + timeout_s
    wait_ms = 0
    while not generator.step(wait_ms):
        trainer.check_background()
        if time.monotonic() > deadline:
            raise SyncError(f"no new policy version within sync.timeout_s={timeout_s}")
        wait_ms = WAIT_MS


def _fill_step(generator: Generator, scorer: RewardScorer, trainer: Trainer, timeout_s: float) -> dict[str, float]:
    """Generate and score batches until the trainer holds a step's groups; each batch after the
    first replaces groups that dynamic sampling skipped. The phase seconds, summed."""
    phases = {"generate_s": 0.0, "score_s": 0.0}
    while True:
        set_aside = trainer.num_set_aside
        started = time.monotonic()
        _generate(generator, trainer, timeout_s)
        generated = time.monotonic()
        while scorer.score_waiting(0):
            pass
        phases["generate_s"] += generated - started
        phases["score_s"] += time.monotonic() - generated
        if trainer.gather(0):
            return phases
        if trainer.num_set_aside == set_aside:  # short, and not by skipping
            raise RuntimeError(
                f"step {trainer.step + 1}: fewer scored groups than trainer.prompts_per_step "
                f"reached the trainer (rejected: {trainer.runtime.store.rejected()})"
            )


def run_sync(config: RunConfig) -> dict[str, Any]:
    config = lock_step_config(config)
    store = MemoryStore()
    hub = MemoryHub(
        config.run_id,
        max_queue=config.broker.max_queue,
        hwm=config.broker.hwm,
        max_message_bytes=config.broker.max_message_bytes,
    )

    def runtime(role: str, worker_id: str) -> RoleRuntime:
        rejections = build.rejections_of(role, config, store)

        def bus() -> Bus:
            return hub.client(worker_id, on_reject=rejections.record)

        return RoleRuntime(role, config, worker_id, store, bus(), rejections, bus)

    runtimes = [runtime("trainer", "trainer"), runtime("generator", "generator-0"), runtime("reward", "reward-0")]
    trainer_rt, generator_rt, reward_rt = runtimes
    trainer = build.trainer(trainer_rt, make_publisher(config.sync, config.run_id), evaluates_all=True)
    receiver = make_receiver(config.sync, generator_rt.worker_id)
    generator = build.generator(generator_rt, receiver, policy=trainer.policy, evaluates=False)
    scorer = build.reward(reward_rt)
    progress = Progress("sync steps", config.trainer.num_steps)
    try:
        trainer.start()
        while not trainer.done:
            started = time.monotonic()
            phases = _fill_step(generator, scorer, trainer, config.sync.timeout_s)
            trainer.train_step(phases, step_started=started)
            progress.update(held_out=trainer.evaluations.final_accuracy)
        summary = trainer.finish("sync")
        for each in runtimes:  # every refusal counted, to report them all
            each.rejections.flush(force=True)
        return summary | {"ledger": store.ledger(), "rejected": store.rejected()}
    finally:
        progress.close()
        for role in (trainer, generator, scorer):
            role.close()
        for each in runtimes:
            each.close()
        store.close()


def run_sync_here(config: RunConfig, resume: bool) -> int:
    """`llamarl run --mode sync`: says what the run keeps (refusing `--resume`, which would
    otherwise start afresh and clear the run directory's checkpoints), then runs on every core
    and prints the summary."""
    if resume:
        raise ConfigError(
            "--resume carries on a stopped async run; --mode sync keeps no "
            "checkpoints or ledger to resume from: drop one of them"
        )
    prepare_run_dir(config, resume=False)
    # What will run (and what a sync run does not keep), once it can start: a bad input is one line.
    print(startup_summary(config, "sync"), file=sys.stderr, flush=True)
    torch.set_num_threads(config.workers.num_cores or usable_cores())
    print(json.dumps(run_sync(config)), flush=True)
    return 0
