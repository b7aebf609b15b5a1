"""The synchronous baseline: the same generator, reward scorer and trainer components as an async
run, placed in one process and run in lock step: generate a step's prompts -> score -> train ->
publish, one version at a time (staleness 0).

Only the placement differs from an async run: the store is a `MemoryStore`, the bus a `MemoryHub`,
and the weight transport the in-process one (the generator samples with the trainer's own model),
which is what `llamarl bench async-vs-sync` compares. Writes RUN_DIR/metrics.jsonl (with each
step's phase seconds: generate_s, score_s, train_s, step_s) and returns the run summary.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import torch

from llamarl.bus import MemoryHub
from llamarl.config import LocalSync, RunConfig
from llamarl.limits import Rejections
from llamarl.roles import build
from llamarl.roles.generator import Generator
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import MemoryStore
from llamarl.tasks import make_prompt_set
from llamarl.weightsync import make_publisher, make_receiver

WAIT_MS = 1000
"""Longest wait for the trainer's new version to be announced (it is one thread away)."""


def lock_step_config(config: RunConfig) -> RunConfig:
    """The run's config for lock step: no lag, one claim per step, the in-process transport."""
    pps = config.trainer.prompts_per_step
    return config.model_copy(
        update={
            "staleness": config.staleness.model_copy(update={"max_staleness": 0}),
            "generation": config.generation.model_copy(update={"prompts_per_batch": pps}),
            "sync": LocalSync(
                **config.sync.model_dump(include=set(LocalSync.model_fields) - {"transport"})
            ),
        }
    )


def run_sync(config: RunConfig) -> dict[str, Any]:
    config = lock_step_config(config)
    store = MemoryStore()
    hub = MemoryHub(config.run_id, max_queue=config.broker.max_queue)

    def runtime(role: str, worker_id: str) -> RoleRuntime:
        rejections = Rejections(
            role, lambda reason, count: store.count_rejected(role, reason, count)
        )

        def bus() -> Any:
            return hub.client(worker_id, on_reject=rejections.record)

        return RoleRuntime(role, config, worker_id, store, bus(), rejections, bus)

    runtimes = [runtime("trainer", "trainer"), runtime("generator", "generator-0"),
                runtime("reward", "reward-0")]  # fmt: skip
    trainer_rt, generator_rt, reward_rt = runtimes
    trainer = build.trainer(trainer_rt, make_publisher(config.sync, config.run_id, None, None))
    rng = torch.Generator().manual_seed(config.seed * 100_003 + zlib.crc32(b"generator-0"))
    generator = Generator(
        generator_rt,
        trainer.policy,
        make_prompt_set(config.task, config.seed),
        make_receiver(config.sync, "generator-0", None),
        rng,
    )
    scorer = build.reward(reward_rt)
    try:
        trainer.start()
        while not trainer.done:
            started = time.monotonic()
            wait_ms = 0
            while not generator.step(wait_ms):
                wait_ms = WAIT_MS
            generated = time.monotonic()
            scorer.score_waiting(0)
            scored = time.monotonic()
            if not trainer.gather(WAIT_MS):
                raise RuntimeError("the step's scored groups did not reach the trainer")
            trainer.train_step(
                {"generate_s": generated - started, "score_s": scored - generated},
                step_started=started,
            )
        return {"mode": "sync"} | trainer.finish()
    finally:
        trainer.close()
        for each in runtimes:
            each.close()
        store.close()
