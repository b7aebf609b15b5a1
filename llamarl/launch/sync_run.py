"""The lock-step loop: the same generator, reward scorer and trainer components as an async run,
placed in one process and run in turn: generate a step's prompts -> score -> train -> publish, one
version at a time (staleness 0). The generator samples with the trainer's own model (the in-process
weight transport), the bus is a `MemoryHub`.

A step whose groups the trainer skipped (dynamic sampling, `sampling.dynamic_sampling`, as often
as its cap on draws allows; or an episode's environment raised) is followed by another batch for
the missing ones.

Given a Redis store (`llamarl.launch.one_process`: the `one_process` layout and `--mode sync`),
the run keeps what an async run keeps: the ledger (every ticket trained exactly once), checkpoints
and a resume from the newest. Without one (tests), the store is a `MemoryStore` and no checkpoint
is written: nothing could resume from it. Writes RUN_DIR/metrics.jsonl (with each step's phase
seconds: generate_s, score_s, train_s, step_s) and returns the run summary, with the ledger and the
refusals counted by reason, as an async run's has them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from llamarl.bus import Bus, MemoryHub
from llamarl.config import LocalSync, RunConfig
from llamarl.errors import SyncError
from llamarl.observe.progress import Progress
from llamarl.roles import build
from llamarl.roles.generator import Generator
from llamarl.roles.reward import RewardScorer
from llamarl.roles.runtime import RoleRuntime
from llamarl.roles.trainer import Trainer
from llamarl.store import MemoryStore, Store
from llamarl.weightsync import make_publisher, make_receiver

WAIT_MS = 100
"""Wait for the trainer's new version to be announced (it is one thread away), between checks
that the publisher thread has not failed."""


def lock_step_config(config: RunConfig, checkpoints: bool = False) -> RunConfig:
    """The run's config for lock step: no lag, one claim per step, the in-process transport;
    the config's checkpoints when `checkpoints`, else none."""
    pps = config.trainer.prompts_per_step
    sync = config.sync.model_dump(include=set(LocalSync.model_fields) - {"transport"})
    every = config.trainer.checkpoint_every if checkpoints else 0
    return config.model_copy(
        update={
            "staleness": config.staleness.model_copy(update={"max_staleness": 0}),
            "generation": config.generation.model_copy(update={"prompts_per_batch": pps}),
            "trainer": config.trainer.model_copy(update={"checkpoint_every": every}),
            "sync": LocalSync(**sync),
        }
    )


def _generate(generator: Generator, trainer: Trainer, timeout_s: float) -> None:
    """One step's batch, sampled with the trainer's newest version: taken up before any claim. A
    ticket reissued after a resume passes the store's gate, which holds back only new tickets
    until the generator has the newest version: sampled with the version before, it was dropped
    as stale and the step came up short."""
    deadline = time.monotonic() + timeout_s
    while generator.policy_version < trainer.policy_version:
        trainer.check_background()
        if time.monotonic() > deadline:
            raise SyncError(f"no new policy version within sync.timeout_s={timeout_s}")
        if (meta := generator.newest_announced(WAIT_MS)) is not None:
            generator.take_up(meta)
    while not generator.step(0):
        trainer.check_background()
        if time.monotonic() > deadline:
            raise SyncError(f"no tickets for policy version {trainer.policy_version} within sync.timeout_s={timeout_s}")
        time.sleep(WAIT_MS / 1000)


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


def run_sync(config: RunConfig, store: Store | None = None, stop: threading.Event | None = None) -> dict[str, Any]:
    """Run `config` in lock step to its last step, or to the step in hand when `stop` is set
    (then checkpointed, to resume from). `store`: the run's Redis (durable), or None for an
    in-memory run."""
    durable = store is not None
    config = lock_step_config(config, checkpoints=durable)
    store = store if store is not None else MemoryStore()
    stop = stop if stop is not None else threading.Event()
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

        made = RoleRuntime(role, config, worker_id, store, bus(), rejections, bus)
        if durable:  # seen by `llamarl monitor` as an async run's workers are
            made.register()
        return made

    runtimes = [runtime("trainer", "trainer"), runtime("generator", "generator-0"), runtime("reward", "reward-0")]
    trainer_rt, generator_rt, reward_rt = runtimes
    trainer = build.trainer(trainer_rt, make_publisher(config.sync, config.run_id), evaluates_all=True)
    receiver = make_receiver(config.sync, generator_rt.worker_id)
    generator = build.generator(generator_rt, receiver, policy=trainer.policy, evaluates=False)
    scorer = build.reward(reward_rt)
    progress = Progress("sync steps", config.trainer.num_steps)
    try:
        trainer.start()
        while not trainer.done and not stop.is_set():
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
        if not durable:
            store.close()
