"""`llamarl worker generator`: claim prompt tickets, sample with the loaded policy version,
publish rollout groups.

It learns of new versions from the trainer's announcements on the `versions` topic (Redis is
the fallback, for an announcement a subscriber missed) and pulls each one on the weight-sync
channel, verified before the swap; a failed pull keeps the old weights and is retried. Tickets
are claimed through the Redis staleness gate for the version it has actually loaded, so it never
samples work that its weights are too old for; when the gate is closed it waits on the next
announcement instead of polling. Every token is tagged with the version that produced it.
"""

from __future__ import annotations

import time
import zlib

import structlog
import torch

from llamarl.engine.model import make_policy
from llamarl.engine.sampling import sample
from llamarl.errors import SyncError
from llamarl.protocol import VersionAnnouncement
from llamarl.rollouts import pack_groups
from llamarl.tasks import make_prompt_set
from llamarl.topics import ROLLOUTS, VERSIONS
from llamarl.version_store import Ticket
from llamarl.weightsync.channel import WeightReceiver
from workers.common import WorkerContext, run_worker

log = structlog.get_logger(__name__)
WAIT_MS = 500
"""Longest wait for an announcement before Redis is asked (and the heartbeat written)."""


def announcement_meta(announcement: VersionAnnouncement) -> dict[str, str]:
    """An announcement in the form the trainer stores it in Redis."""
    return {
        "policy_version": str(announcement.policy_version),
        "num_bytes": str(announcement.num_bytes),
        "checksum": announcement.checksum,
        "transport": announcement.transport,
        "endpoint": announcement.endpoint,
    }


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
        self.versions = ctx.bus.subscribe([VERSIONS])
        self.receiver = WeightReceiver(
            ctx.worker_id, config.sync.timeout_s, ctx.curve, config.sync.verify
        )

    def _count(self, name: str, amount: int = 1) -> None:
        self.ctx.counters[name] = self.ctx.counters.get(name, 0) + amount

    def newest_announced(self, wait_ms: int) -> dict[str, str] | None:
        """The newest version announced above ours, waiting up to `wait_ms` for one; after a
        wait with nothing heard, Redis is asked (a PUB/SUB message can be missed)."""
        newest: dict[str, str] | None = None
        timeout = wait_ms
        while (message := self.versions.recv(timeout)) is not None:
            announcement = message[1].payload
            if announcement.policy_version > max(self.policy_version, -1) and (
                newest is None or announcement.policy_version > int(newest["policy_version"])
            ):
                newest = announcement_meta(announcement)
            timeout = 0
        if newest is None and wait_ms > 0 and self.ctx.store.policy_version() > self.policy_version:
            newest = self.ctx.store.version_meta()
        return newest

    def sync_weights(self, meta: dict[str, str]) -> None:
        """Pull the version `meta` describes and swap it in; keep ours if the pull fails."""
        try:
            version, buffer = self.receiver.fetch(meta, self.ctx.stop_requested)
        except SyncError as err:
            self._count("sync_failures")
            log.warning("weight sync failed; keeping current weights", error=str(err))
            return
        if version > self.policy_version:
            self.receiver.swap_in(self.policy.model, buffer, mapped=meta["transport"] == "shm")
            self.policy_version = version
            structlog.contextvars.bind_contextvars(policy_version=version)
            self._count("syncs")

    def claim(self) -> list[Ticket]:
        config = self.ctx.config
        return self.ctx.store.claim_tickets(
            self.ctx.worker_id,
            config.generation.prompts_per_batch,
            lease_s=config.staleness.lease_s,
            max_staleness=config.staleness.max_staleness,
            prompts_per_step=self.prompts_per_version,
            total_tickets=self.total_tickets,
            policy_version=self.policy_version,
        )

    def generate(self, tickets: list[Ticket]) -> None:
        gen = self.ctx.config.generation
        started = time.monotonic()
        examples = [self.prompt_set.train_item(t.ticket_id) for t in tickets]
        batch = sample(
            self.policy,
            [self.policy.encode_prompt(e.prompt) for e in examples],
            num_samples=gen.num_samples,
            max_new_tokens=gen.max_new_tokens,
            min_new_tokens=gen.min_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=self.rng,
        )
        self.ctx.add_time("sample_s", started)
        started = time.monotonic()
        pairs = [(t.ticket_id, t.attempt) for t in tickets]
        groups = pack_groups(self.policy, batch, examples, pairs, self.policy_version)
        # A lease lost meanwhile was reissued to another generator: its result would only be a
        # duplicate, so it is not sent.
        held = self.ctx.store.renew_leases(tickets, self.ctx.config.staleness.lease_s)
        for group, still_held in zip(groups, held, strict=True):
            if still_held:
                self.ctx.bus.push(ROLLOUTS, group, self.policy_version)
        self.ctx.add_time("publish_s", started)
        self._count("leases_lost", held.count(False))
        self._count("groups", len(tickets))
        self._count("generated_tokens", int(batch.completion_mask.sum()))

    def run(self) -> None:
        ctx = self.ctx
        wait_ms = WAIT_MS  # no version yet: wait for the first one
        while not ctx.stopping:
            ctx.beat(policy_version=self.policy_version)
            if ctx.stopping:
                break
            # After a claim that got nothing the gate is closed until a newer version: wait for
            # its announcement instead of polling. Otherwise only look for one.
            meta = self.newest_announced(wait_ms)
            ctx.timer.busy()
            if meta is not None:
                started = time.monotonic()
                self.sync_weights(meta)
                ctx.add_time("sync_s", started)
            started = time.monotonic()
            tickets = self.claim() if self.policy_version >= 0 else []
            ctx.add_time("claim_s", started)
            if tickets:
                self.generate(tickets)
            ctx.timer.idle()
            wait_ms = 0 if tickets else WAIT_MS


def main(argv: list[str] | None = None) -> int:
    return run_worker("generator", argv, lambda ctx: Generator(ctx).run())
