"""`llamarl monitor`: watch a run from its Redis alone (any machine that reaches Redis).

Prints the progress line (trainer step and version, reward, held-out accuracy and each named
evaluation set's latest metrics (`<set>/greedy`, `<set>/pass@k`, `<set>/mean@n`), largest staleness,
ticket ledger; `skipped` once dynamic sampling has skipped a group), one line per worker (role,
status, alive or dead by heartbeat TTL, seconds since its last heartbeat, policy version) and the
rejected-input counts, every `--interval` seconds; `--once` prints one snapshot and exits
(scripts, health checks).
"""

from __future__ import annotations

import argparse
import sys
import time

from llamarl.config import load_config, parse_config
from llamarl.store import RedisStore, Store, without_password

SET_PREFIX = "eval/"
"""Heartbeat fields of the named evaluation sets (`llamarl.training.eval_sets`)."""


def progress_line(store: Store, total_steps: int) -> str:
    """Progress from the heartbeat of the run's trainer, whatever its worker id (a live one
    first)."""
    trainers = [w for w in store.workers() if w.fields.get("role") == "trainer"]
    trainers.sort(key=lambda w: not w.alive)
    trainer = trainers[0].fields if trainers else {}
    ledger = store.ledger()
    status = trainer.get("status", "not started")
    phase = "" if status in ("running", "stopped") else f"trainer {status}  "
    held_out = trainer.get("held_out_accuracy")
    skipped = f" skipped {ledger['skipped']}" if ledger["skipped"] else ""  # dynamic sampling's
    sets = "".join(
        f"  {name[len(SET_PREFIX) :]} {float(value):.3f}"
        for name, value in sorted(trainer.items())
        if name.startswith(SET_PREFIX)
    )
    return (
        f"{phase}step {trainer.get('step', 0)}/{total_steps}"
        f"  version {trainer.get('policy_version', '-')}"
        f"  reward {float(trainer.get('reward_mean', 0)):.3f}"
        f"  held-out {'-' if held_out is None else f'{float(held_out):.3f}'}{sets}"
        f"  staleness max {trainer.get('max_staleness', 0)}"
        f"  tickets issued {ledger['issued']} trained {ledger['trained']}{skipped}"
        f" stale {ledger['dropped_stale']} open {ledger['open']}"
    )


def snapshot(store: RedisStore, total_steps: int) -> str:
    lines = [f"run {store.run_id}: {progress_line(store, total_steps)}"]
    now = time.time()
    for worker in store.workers():
        fields = worker.fields
        seen = f"{now - float(fields['last_seen']):.0f}s ago" if "last_seen" in fields else "-"
        state = worker.state
        lines.append(
            f"  {worker.worker_id:<24} {fields.get('role', '?'):<10}"
            f" {fields.get('status', '-'):<9} {state:<6} seen {seen:<8}"
            f" version {fields.get('policy_version', '-')}"
        )
    rejected = store.rejected()
    if rejected:
        lines.append("  rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(rejected.items())))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else parse_config({})
    if config.redis.url is None:
        print("monitor: no redis.url (set it in the config or LLAMARL_REDIS_URL)", file=sys.stderr)
        return 2
    store = RedisStore(config.redis.url, config.run_id, config.redis.connect_deadline_s)
    try:
        while True:
            if store.has_keys():
                print(snapshot(store, config.trainer.num_steps), flush=True)
            else:
                print(
                    f"monitor: run {config.run_id} has no keys in the Redis at "
                    f"{without_password(config.redis.url)}; check run_id (or LLAMARL_RUN_ID), or wait for the "
                    "run to start",
                    file=sys.stderr,
                    flush=True,
                )
                if args.once:
                    return 1
            if args.once:
                return 0
            time.sleep(args.interval)
    except ConnectionError as err:
        print(f"monitor: {err}", file=sys.stderr)
        return 3
    finally:
        store.close()
