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

With continuous batching (`generation.batching`, the default) the generator keeps one running
batch of up to `prompts_per_batch` x `num_samples` rows (`llamarl.roles.in_flight`): a row leaves
when it ends, a ticket is claimed as soon as `num_samples` places are free, each group is
published the moment its samples have all ended, and with
`generation.inflight_updates` swaps a new version in between two decode steps, restarting any
group whose oldest token would fall more than `max_staleness` versions behind. A sync run's
batch goes through the same running batch, claimed whole and drained.
"""

from __future__ import annotations

from collections import Counter

import structlog
import torch

from llamarl.engine.batches import running_batch
from llamarl.engine.continuous import Sampler
from llamarl.engine.episodes import PlaysEpisodes, Sampling
from llamarl.engine.model import Policy
from llamarl.engine.rollouts import pack_episodes, pack_groups
from llamarl.engine.sampling import sample
from llamarl.engine.vllm_engine import VllmEngine
from llamarl.errors import SyncError
from llamarl.protocol import RolloutGroup, VersionAnnouncement
from llamarl.roles.base import RoleResult
from llamarl.roles.held_out import GeneratorEvaluations
from llamarl.roles.in_flight import Finished, InFlight
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import Ticket
from llamarl.tasks import Example, PromptSet
from llamarl.topics import ROLLOUTS, VERSIONS
from llamarl.weightsync import VersionRecord, WeightReceiver

log = structlog.get_logger(__name__)
AGAINST_THE_RULES = ("env_error", "env_timeout", "agent_error", "agent_timeout", "max_requests")
"""The ends of episodes whose environment or agent broke a rule, counted as episodes_REASON."""
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
        episodes: PlaysEpisodes | None = None,
        evaluations: GeneratorEvaluations | None = None,
        engine: VllmEngine | None = None,
    ) -> None:
        self.runtime = runtime
        self.engine = engine
        """The vLLM engine that samples (None: the native engine on `policy`); each version is
        received into `policy`'s model and loaded into it from there."""
        self.episodes = episodes
        """Plays multi-turn episodes (environment.kind); None samples one completion each."""
        self.evaluations = evaluations
        """Evaluates the versions it takes up that reach an evaluation step (None: the
        trainer evaluates them all)."""
        self.policy = policy
        self.prompt_set = prompt_set
        self.receiver = receiver
        self.rng = rng
        self.policy_version = -1
        config = runtime.config
        self.prompts_per_version = config.trainer.prompts_per_step * config.sync.every_steps
        self.total_tickets = config.trainer.num_steps * config.trainer.prompts_per_step
        self.versions = runtime.bus.subscribe([VERSIONS])
        gen = config.generation
        sampler = Sampler(gen.num_samples, gen.max_new_tokens, gen.min_new_tokens, gen.temperature, gen.top_p, rng)
        self.in_flight: InFlight | None = None
        """The running batch (continuous batching); None: a static batch at a time."""
        if gen.batching == "continuous" and episodes is None:
            self.in_flight = InFlight(policy, running_batch(policy, sampler, engine))
        self.claim_at = 0.0
        """The clock time before which the staleness gate is taken to be closed."""
        self.waiting: dict[str, str] | None = None
        """A version announced while the batch runs, taken up once it has drained (continuous
        batching without in-flight updates)."""

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
        # A trainer restarted on a new endpoint records its first version there: a request to
        # the old one, unanswered, is dropped for it within a heartbeat.
        record = VersionRecord(self.runtime.store.version_meta, self.runtime.config.workers.heartbeat_s)
        try:
            version, buffer = self.receiver.fetch(meta, self.runtime.stop_requested, record)
        except SyncError as err:
            self.runtime.count("sync_failures")
            log.warning("weight sync failed; keeping current weights", error=str(err))
            return
        if version > self.policy_version:
            self.receiver.swap_in(self.policy.model, buffer)
            if self.engine is not None:
                started = self.runtime.clock()
                self.engine.load(self.policy.model)
                self.runtime.add_time("engine_load_s", started)
            self.policy_version = version
            structlog.contextvars.bind_contextvars(policy_version=version)
            self.runtime.count("syncs")

    def claim(self, count: int) -> list[Ticket]:
        runtime = self.runtime
        config = runtime.config
        return runtime.store.claim_tickets(
            runtime.worker_id,
            count,
            lease_s=config.staleness.lease_s,
            max_staleness=config.staleness.max_staleness,
            prompts_per_step=self.prompts_per_version,
            total_tickets=self.total_tickets,
            policy_version=self.policy_version,
        )

    def completions(self, tickets: list[Ticket], examples: list[Example]) -> tuple[list[RolloutGroup], int]:
        """One group per ticket, and the tokens the model wrote for them."""
        gen = self.runtime.config.generation
        pairs = [(t.ticket_id, t.attempt) for t in tickets]
        if self.in_flight is not None:
            return self.drained(tickets, examples)
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
            for reason in AGAINST_THE_RULES:
                self.runtime.count(f"episodes_{reason}", ends[reason])
            written = sum(sum(v >= 0 for v in e.versions) for e in episodes)
            return pack_episodes(episodes, examples, pairs), written
        batch = sample(
            self.policy,
            [self.policy.encode_example(e) for e in examples],
            num_samples=gen.num_samples,
            max_new_tokens=gen.max_new_tokens,
            min_new_tokens=gen.min_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=self.rng,
        )
        groups = pack_groups(self.policy, batch, examples, pairs, self.policy_version)
        return groups, int(batch.completion_mask.sum())

    def drained(self, tickets: list[Ticket], examples: list[Example]) -> tuple[list[RolloutGroup], int]:
        """A whole batch through the running batch, decoded until every group has ended."""
        assert self.in_flight is not None
        self.in_flight.admit(tickets, examples)
        done: list[Finished] = []
        while len(self.in_flight):
            done += self.in_flight.step(self.policy_version)
        order = {t.ticket_id: i for i, t in enumerate(tickets)}
        done.sort(key=lambda f: order[f.ticket.ticket_id])
        return [f.group for f in done], sum(f.num_tokens for f in done)

    def take_up(self, meta: dict[str, str]) -> None:
        started = self.runtime.clock()
        self.sync_weights(meta)
        self.runtime.add_time("sync_s", started)
        if self.evaluations is not None:
            self.evaluations.after_version(self.policy_version)

    def evaluate_held(self) -> None:
        """Take over chunks of the held version's evaluation whose claimers died (at most once
        a heartbeat; `llamarl.roles.held_out`)."""
        if self.evaluations is not None:
            self.evaluations.while_holding(self.policy_version)

    def take_up_newer(self) -> None:
        """Between an episode's turns: swap in a version announced meanwhile, so the next turns
        are sampled with it (each token keeps the version that sampled it)."""
        meta = self.newest_announced(0)
        if meta is not None:
            self.take_up(meta)

    def publish(self, tickets: list[Ticket], groups: list[RolloutGroup], num_tokens: int) -> None:
        """Send the groups whose tickets this generator still holds. A lease lost meanwhile was
        reissued to another generator: its result would only be a duplicate."""
        runtime = self.runtime
        started = runtime.clock()
        held = runtime.store.renew_leases(tickets, runtime.config.staleness.lease_s)
        for group, still_held in zip(groups, held, strict=True):
            if still_held:
                runtime.bus.push(ROLLOUTS, group, self.policy_version)
        runtime.add_time("publish_s", started)
        runtime.count("leases_lost", held.count(False))
        runtime.count("groups", len(tickets))
        runtime.count("generated_tokens", num_tokens)

    def generate(self, tickets: list[Ticket]) -> None:
        runtime = self.runtime
        started = runtime.clock()
        examples = [self.prompt_set.train_item(t.ticket_id) for t in tickets]
        groups, num_tokens = self.completions(tickets, examples)
        runtime.add_time("sample_s", started)
        self.publish(tickets, groups, num_tokens)

    def step(self, wait_ms: int) -> bool:
        """Take up a newer version if one is announced (waiting up to `wait_ms`), then claim and
        generate one batch; False when the gate gave nothing."""
        runtime = self.runtime
        meta = self.newest_announced(wait_ms)
        runtime.timer.busy()
        if meta is not None:
            self.take_up(meta)
        started = runtime.clock()
        count = runtime.config.generation.prompts_per_batch
        tickets = self.claim(count) if self.policy_version >= 0 else []
        runtime.add_time("claim_s", started)
        if tickets:
            with runtime.keep_alive("running", beat_now=False):  # an LLM's batch can be long
                self.generate(tickets)
        runtime.timer.idle()
        return bool(tickets)

    def start(self) -> None:
        """Nothing before the loop: the first version arrives like any other."""

    def follow_versions(self, wait_ms: int) -> None:
        """Take up the newest announced version: at once when the batch is empty or with
        in-flight updates (restarting the groups it leaves too old), else once it has drained."""
        assert self.in_flight is not None
        config = self.runtime.config
        meta = self.newest_announced(wait_ms)
        running = len(self.in_flight) > 0
        if meta is not None and running and not config.generation.inflight_updates:
            self.waiting, meta = meta, None
        elif meta is None and not running and self.waiting is not None:
            meta = self.waiting
        if meta is None:
            return
        self.waiting = None
        self.take_up(meta)
        floor = self.policy_version - config.staleness.max_staleness
        restarted, discarded = self.in_flight.restart_older_than(floor)
        self.runtime.count("groups_restarted", restarted)
        self.runtime.count("discarded_tokens", discarded)
        self.claim_at = 0.0

    def fill(self) -> None:
        """Claim tickets for the batch's free places (none while a version waits for it to
        drain); after a claim that got nothing the gate stays closed until a newer version, or
        WAIT_MS (dynamic sampling can hand a slot back)."""
        assert self.in_flight is not None
        runtime = self.runtime
        free = self.in_flight.batch.free_groups(runtime.config.generation.prompts_per_batch)
        if free <= 0 or self.waiting is not None or self.policy_version < 0:
            return
        if runtime.clock() < self.claim_at:
            return
        started = runtime.clock()
        tickets = self.claim(free)
        runtime.add_time("claim_s", started)
        if not tickets:
            self.claim_at = runtime.clock() + WAIT_MS / 1000
            return
        self.in_flight.admit(tickets, [self.prompt_set.train_item(t.ticket_id) for t in tickets])

    def stream(self) -> None:
        """The loop with continuous batching: follow versions, keep the batch full, decode one
        step, publish the groups it ended."""
        assert self.in_flight is not None
        runtime, in_flight = self.runtime, self.in_flight
        self.claim_at = 0.0
        busy = False
        while not runtime.stopping:
            runtime.beat(policy_version=self.policy_version)
            if runtime.stopping:
                break
            self.evaluate_held()
            gate_closed = self.policy_version < 0 or runtime.clock() < self.claim_at
            self.follow_versions(WAIT_MS if not len(in_flight) and gate_closed else 0)
            self.fill()
            if not len(in_flight):
                if busy:
                    runtime.timer.idle()
                busy = False
                continue
            if not busy:
                runtime.timer.busy()
            busy = True
            started = runtime.clock()
            done = in_flight.step(self.policy_version)
            runtime.add_time("sample_s", started)
            if done:
                self.publish([f.ticket for f in done], [f.group for f in done], sum(f.num_tokens for f in done))
        if busy:
            runtime.timer.idle()

    def run(self) -> RoleResult:
        runtime = self.runtime
        if self.in_flight is not None:
            self.stream()
            return RoleResult(runtime.role, runtime.worker_id, int(runtime.counters.get("groups", 0)))
        wait_ms = WAIT_MS  # no version yet: wait for the first one
        while not runtime.stopping:
            runtime.beat(policy_version=self.policy_version)
            if runtime.stopping:
                break
            self.evaluate_held()
            # After a claim that got nothing the gate is closed until a newer version (or, with
            # dynamic sampling, a skipped ticket's slot coming back): wait up to WAIT_MS for an
            # announcement instead of polling. Otherwise only look for one.
            wait_ms = 0 if self.step(wait_ms) else WAIT_MS
        groups = int(runtime.counters.get("groups", 0))
        return RoleResult(runtime.role, runtime.worker_id, groups)

    def close(self) -> None:
        self.receiver.close()
