"""`llamarl worker reward`: score rollout groups with the task's verifier and pass them on."""

from __future__ import annotations

from llamarl.rewards import make_verifier
from llamarl.rollouts import score_group
from llamarl.topics import ROLLOUTS, SCORED
from workers.common import WorkerContext, run_worker

POLL_MS = 50


def serve(ctx: WorkerContext) -> None:
    name = ctx.config.task.verifier
    verifier = make_verifier(name)
    config = ctx.config
    credit = config.broker.consumer_credit or config.generation.prompts_per_batch
    consumer = ctx.bus.consume(ROLLOUTS, credit=credit)
    scored = 0
    while not ctx.stopping:
        ctx.beat(scored=scored)
        envelope = consumer.recv(POLL_MS)
        if envelope is None:
            continue
        ctx.timer.busy()
        result = score_group(envelope.payload, verifier, name)
        ctx.bus.push(SCORED, result, envelope.policy_version)
        scored += 1
        ctx.counters["scored"] = scored
        ctx.timer.idle()


def main(argv: list[str] | None = None) -> int:
    return run_worker("reward", argv, serve)
