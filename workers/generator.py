"""`llamarl worker generator`: claim prompt tickets, sample with the current policy version,
publish rollout groups.

Before each batch it pulls any newer version announced in Redis (verified before the swap; a
failed pull keeps the old weights and is retried). It claims tickets through the Redis staleness
gate, so it never runs more than `max_staleness` versions ahead of the trainer, and tags every
token with the version that produced it.
"""

from __future__ import annotations

import time
import zlib

import structlog
import torch

from llamarl.engine.model import make_policy
from llamarl.engine.sampling import sample
from llamarl.errors import SyncError
from llamarl.rollouts import pack_groups
from llamarl.tasks import make_prompt_set
from llamarl.topics import ROLLOUTS
from llamarl.version_store import Ticket
from llamarl.weightsync.channel import fetch_weights
from llamarl.weightsync.flat import load_flat
from workers.common import WorkerContext, run_worker

log = structlog.get_logger(__name__)
IDLE_SLEEP_S = 0.02


class Generator:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        config = ctx.config
        self.policy = make_policy(config.model, config.seed)
        self.prompt_set = make_prompt_set(config.task, config.seed)
        self.policy_version = -1
        self.rng = torch.Generator().manual_seed(
            config.seed * 100_003 + zlib.crc32(ctx.worker_id.encode())
        )
        steps = config.trainer.num_steps
        self.prompts_per_version = config.trainer.prompts_per_step * config.sync.every_steps
        self.total_tickets = steps * config.trainer.prompts_per_step

    def sync_weights(self) -> None:
        """Swap in the latest announced version if it is newer than ours."""
        announced = self.ctx.store.policy_version()
        if announced <= self.policy_version:
            return
        meta = self.ctx.store.version_meta()
        try:
            version, buffer = fetch_weights(
                meta,
                self.ctx.worker_id,
                self.ctx.config.sync.timeout_s,
                self.ctx.stop_requested,
                self.ctx.curve,
            )
        except SyncError as err:
            self.ctx.counters["sync_failures"] = self.ctx.counters.get("sync_failures", 0) + 1
            log.warning("weight sync failed; keeping current weights", error=str(err))
            return
        if version > self.policy_version:
            load_flat(self.policy.model, buffer)
            self.policy_version = version
            structlog.contextvars.bind_contextvars(policy_version=version)
            self.ctx.counters["syncs"] = self.ctx.counters.get("syncs", 0) + 1

    def claim(self) -> list[Ticket]:
        config = self.ctx.config
        tickets = []
        for _ in range(config.generation.prompts_per_batch):
            ticket = self.ctx.store.claim_ticket(
                self.ctx.worker_id,
                lease_s=config.staleness.lease_s,
                max_staleness=config.staleness.max_staleness,
                prompts_per_step=self.prompts_per_version,
                total_tickets=self.total_tickets,
            )
            if ticket is None:
                break
            tickets.append(ticket)
        return tickets

    def generate(self, tickets: list[Ticket]) -> None:
        gen = self.ctx.config.generation
        examples = [self.prompt_set.train_item(t.ticket_id) for t in tickets]
        batch = sample(
            self.policy,
            [self.policy.tokenizer(e.prompt).input_ids for e in examples],
            num_samples=gen.num_samples,
            max_new_tokens=gen.max_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=self.rng,
        )
        pairs = [(t.ticket_id, t.attempt) for t in tickets]
        groups = pack_groups(self.policy, batch, examples, pairs, self.policy_version)
        lease_s = self.ctx.config.staleness.lease_s
        for ticket, group in zip(tickets, groups, strict=True):
            # A lease lost meanwhile was reissued to another generator: its result would only be
            # a duplicate, so it is not sent.
            if not self.ctx.store.renew_lease(ticket, lease_s):
                self.ctx.counters["leases_lost"] = self.ctx.counters.get("leases_lost", 0) + 1
                continue
            self.ctx.bus.push(ROLLOUTS, group, self.policy_version)
        self.ctx.counters["groups"] = self.ctx.counters.get("groups", 0) + len(tickets)

    def run(self) -> None:
        ctx = self.ctx
        while not ctx.stopping:
            ctx.beat(policy_version=self.policy_version)
            if ctx.stopping:
                break
            ctx.timer.busy()
            self.sync_weights()
            tickets = self.claim() if self.policy_version >= 0 else []
            if tickets:
                self.generate(tickets)
            ctx.timer.idle()
            if not tickets:
                time.sleep(IDLE_SLEEP_S)


def main(argv: list[str] | None = None) -> int:
    return run_worker("generator", argv, lambda ctx: Generator(ctx).run())
