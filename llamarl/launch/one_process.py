"""The `one_process` layout (`workers.layout: one_process`; `llamarl run --mode sync` is the same
program, started by workers/one_process.py): generation, scoring and training take turns in this
process (the lock-step loop, `llamarl.launch.sync_run`), the generator sampling with the trainer's
own model, and the run kept as an async run keeps it: the Redis ledger (every ticket trained
exactly once), a checkpoint every `trainer.checkpoint_every` steps and on a stop, and `--resume`
from the newest.

Nothing crosses a process: no broker, no weight transport, no second copy of the weights. The first
Ctrl-C (or SIGTERM) stops after the step in hand, with a checkpoint; a second stops at once (a
resume then redoes the steps since the newest checkpoint, each ticket still trained once).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch

from llamarl.config import RunConfig
from llamarl.launch.cores import usable_cores
from llamarl.launch.startup import startup_summary
from llamarl.launch.sync_run import run_sync
from llamarl.store import RedisStore


@contextmanager
def stop_on_signal() -> Iterator[threading.Event]:
    """An event the first SIGINT or SIGTERM sets (the loop stops after its step); the second
    raises KeyboardInterrupt. The handlers before are put back on the way out."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(
            f"{signal.Signals(signum).name}: stopping after this step, with a checkpoint (again to stop now)",
            file=sys.stderr,
            flush=True,
        )

    before = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def run_in_turn(config: RunConfig, redis_url: str) -> dict[str, Any]:
    """Run (or carry on) `config` in this process on every core it may use, its ledger in the
    Redis at `redis_url`; the run's summary."""
    # What will run, once it can: a bad input before this point is its one line alone.
    print(startup_summary(config, "one_process"), file=sys.stderr, flush=True)
    torch.set_num_threads(config.workers.num_cores or usable_cores())
    store = RedisStore(redis_url, config.run_id, config.redis.connect_deadline_s)
    try:
        with stop_on_signal() as stop:
            return run_sync(config, store, stop)
    finally:
        store.close()
