"""The generator: claim prompt tickets, sample with the loaded policy version, publish rollout
groups.

It learns of new versions from the trainer's announcements on the `versions` topic (the store is
the fallback, for an announcement a subscriber missed) and pulls each one through its weight
receiver, verified before the swap; a failed pull keeps the old weights and is retried. Tickets
are claimed through the store's staleness gate for the version it has actually loaded, so it never
samples work that its weights are too old for; when the gate is closed it waits on the next
announcement instead of polling. Every token is tagged with the version that produced it: with an
environment (multi-turn episodes, `llamarl.engine.episodes`) a version announced between two
turns is taken up before the next, so an episode's later turns may be newer than its first; the
staleness gate and the trainer judge it by its oldest token.
"""

from __future__ import annotations

from collections import Counter

import structlog
import torch

from llamarl.engine.episodes import EpisodeRunner, Sampling
from llamarl.engine.model import Policy
from llamarl.engine.rollouts import pack_episodes, pack_groups
from llamarl.engine.sampling import sample
from llamarl.errors import SyncError
from llamarl.protocol import RolloutGroup, VersionAnnouncement
from llamarl.roles.base import RoleResult
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import Ticket
from llamarl.tasks import Example, PromptSet
from llamarl.topics import ROLLOUTS, VERSIONS
from llamarl.weightsync import WeightReceiver

log = structlog.get_logger(__name__)
WAIT_MS = 500
"""Longest wait for an announcement before the store is asked (and the heartbeat written)."""


def announcement_meta(announcement: VersionAnnouncement) -> dict[str, str]:
    """An announcement in the form the trainer stores it."""
    return {
        "policy_version": str(announcement.policy_version),
        "num_bytes": str(announcement.num_bytes),
        "checksum": announcement.checksum,
        "transport": announcement.transport,
        "endpoint": announcement.endpoint,
        "layout": announcement.layout,
    }


class Generator:
    def __init__(
        self,
        runtime: RoleRuntime,
        policy: Policy,
        prompt_set: PromptSet,
        receiver: WeightReceiver,
        rng: torch.Generator,
        episodes: EpisodeRunner | None = None,
    ) -> None:
        self.runtime = runtime
        self.episodes = episodes
        """Plays multi-turn episodes (environment.kind); None samples one completion each."""
        self.policy = policy
        self.prompt_set = prompt_set
        self.receiver = receiver
        self.rng = rng
        self.policy_version = -1
        config = runtime.config
        self.prompts_per_version = config.trainer.prompts_per_step * config.sync.every_steps
        self.total_tickets = config.trainer.num_steps * config.trainer.prompts_per_step
        self.versions = runtime.bus.subscribe([VERSIONS])

    def newest_announced(self, wait_ms: int) -> dict[str, str] | None:
        """The newest version announced above ours, waiting up to `wait_ms` for one; after a
        wait with nothing heard, the store is asked (a fan-out message can be missed)."""
        newest: dict[str, str] | None = None
        timeout = wait_ms
        while (message := self.versions.recv(timeout)) is not None:
            announcement = message[1].payload
            if announcement.policy_version > self.policy_version and (
                newest is None or announcement.policy_version > int(newest["policy_version"])
            ):
                newest = announcement_meta(announcement)
            timeout = 0
        store = self.runtime.store
        if newest is None and wait_ms > 0 and store.policy_version() > self.policy_version:
            newest = store.version_meta()
        return newest

    def sync_weights(self, meta: dict[str, str]) -> None:
        """Pull the version `meta` describes and swap it in; keep ours if the pull fails."""
        try:
            version, buffer = self.receiver.fetch(meta, self.runtime.stop_requested)
        except SyncError as err:
            self.runtime.count("sync_failures")
            log.warning("weight sync failed; keeping current weights", error=str(err))
            return
        if version > self.policy_version:
            self.receiver.swap_in(self.policy.model, buffer)
            self.policy_version = version
            structlog.contextvars.bind_contextvars(policy_version=version)
            self.runtime.count("syncs")

    def claim(self) -> list[Ticket]:
        runtime = self.runtime
        config = runtime.config
        return runtime.store.claim_tickets(
            runtime.worker_id,
            config.generation.prompts_per_batch,
            lease_s=config.staleness.lease_s,
            max_staleness=config.staleness.max_staleness,
            prompts_per_step=self.prompts_per_version,
            total_tickets=self.total_tickets,
            policy_version=self.policy_version,
        )

    def completions(
        self, examples: list[Example], pairs: list[tuple[int, int]]
    ) -> tuple[list[RolloutGroup], int]:
        """One group per example, and the tokens the model wrote for them."""
        gen = self.runtime.config.generation
        if self.episodes is not None:
            episodes = self.episodes.run(
                examples,
                gen.num_samples,
                Sampling(gen.max_new_tokens, gen.temperature, gen.top_p, self.rng),
                version=lambda: self.policy_version,
                before_turn=self.take_up_newer,
            )
            self.runtime.count("episode_turns", sum(e.num_model_turns for e in episodes))
            ends = Counter(e.end for e in episodes)
            for reason in ("env_error", "env_timeout"):
                self.runtime.count(f"episodes_{reason}", ends[reason])
            written = sum(sum(v >= 0 for v in e.versions) for e in episodes)
            return pack_episodes(episodes, examples, pairs), written
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
        groups = pack_groups(self.policy, batch, examples, pairs, self.policy_version)
        return groups, int(batch.completion_mask.sum())

    def take_up_newer(self) -> None:
        """Between an episode's turns: swap in a version announced meanwhile, so the next turns
        are sampled with it (each token keeps the version that sampled it)."""
        meta = self.newest_announced(0)
        if meta is not None:
            started = self.runtime.clock()
            self.sync_weights(meta)
            self.runtime.add_time("sync_s", started)

    def generate(self, tickets: list[Ticket]) -> None:
        runtime = self.runtime
        started = runtime.clock()
        examples = [self.prompt_set.train_item(t.ticket_id) for t in tickets]
        pairs = [(t.ticket_id, t.attempt) for t in tickets]
        groups, num_tokens = self.completions(examples, pairs)
        runtime.add_time("sample_s", started)
        started = runtime.clock()
        # A lease lost meanwhile was reissued to another generator: its result would only be a
        # duplicate, so it is not sent.
        held = runtime.store.renew_leases(tickets, runtime.config.staleness.lease_s)
        for group, still_held in zip(groups, held, strict=True):
            if still_held:
                runtime.bus.push(ROLLOUTS, group, self.policy_version)
        runtime.add_time("publish_s", started)
        runtime.count("leases_lost", held.count(False))
        runtime.count("groups", len(tickets))
        runtime.count("generated_tokens", num_tokens)

    def step(self, wait_ms: int) -> bool:
        """Take up a newer version if one is announced (waiting up to `wait_ms`), then claim and
        generate one batch; False when the gate gave nothing."""
        runtime = self.runtime
        meta = self.newest_announced(wait_ms)
        runtime.timer.busy()
        if meta is not None:
            started = runtime.clock()
            self.sync_weights(meta)
            runtime.add_time("sync_s", started)
        started = runtime.clock()
        tickets = self.claim() if self.policy_version >= 0 else []
        runtime.add_time("claim_s", started)
        if tickets:
            with runtime.keep_alive("running", beat_now=False):  # an LLM's batch can be long
                self.generate(tickets)
        runtime.timer.idle()
        return bool(tickets)

    def start(self) -> None:
        """Nothing before the loop: the first version arrives like any other."""

    def run(self) -> RoleResult:
        runtime = self.runtime
        wait_ms = WAIT_MS  # no version yet: wait for the first one
        while not runtime.stopping:
            runtime.beat(policy_version=self.policy_version)
            if runtime.stopping:
                break
            # After a claim that got nothing the gate is closed until a newer version (or, with
            # dynamic sampling, a skipped ticket's slot coming back): wait up to WAIT_MS for an
            # announcement instead of polling. Otherwise only look for one.
            wait_ms = 0 if self.step(wait_ms) else WAIT_MS
        groups = int(runtime.counters.get("groups", 0))
        return RoleResult(runtime.role, runtime.worker_id, groups)

    def close(self) -> None:
        self.receiver.close()
