"""Message kinds and the envelope every message crossing a process boundary travels in.

A rollout travels as one group: the n completions (or episodes) of one prompt ticket, padded to a
common length, with the behaviour log-prob and the policy version of every generated token.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llamarl.protocol.arrays import TypedArray


@dataclass(frozen=True)
class RolloutGroup:
    """n sampled completions of one prompt ticket, as published by a generator."""

    KIND: ClassVar[str] = "rollout_group"
    rollout_id: str
    ticket_id: int
    attempt: int
    prompt_index: int
    prompt: str
    answer: str
    prompt_tokens: TypedArray
    """int32 (P,), unpadded prompt token ids."""
    completion_tokens: TypedArray
    """int32 (n, L), right-padded completion token ids."""
    completion_lengths: TypedArray
    """int32 (n,), valid tokens per completion."""
    behaviour_logprobs: TypedArray
    """float32 (n, L), log mu of each sampled token under the sampling distribution."""
    token_versions: TypedArray
    """int32 (n, L), policy version of the weights that produced each token."""
    completions: TypedArray
    """uint8 (bytes), the decoded completion texts joined by NUL (an episode's: its model's
    last turn)."""
    episodes: str = ""
    """Multi-turn only: JSON, one record per completion (its turns, the environment's reward or
    null, and why it ended). The tokens the environment wrote have version -1 and log-prob 0."""


REWARD_LIMIT = 3.4028234663852886e38
"""float32's largest value: rewards travel and train as float32, where a float past it (1e300,
finite in Python) is infinite and its group is refused."""


def trainable_reward(number: float) -> bool:
    """Whether a reward survives the trip to the trainer (False for NaN and infinities too)."""
    return abs(number) <= REWARD_LIMIT


@dataclass(frozen=True)
class ScoredGroup:
    """A rollout group with one reward per completion, as published by a reward worker."""

    KIND: ClassVar[str] = "scored_group"
    group: RolloutGroup
    rewards: TypedArray
    """float32 (n,)."""
    scorer: str
    components: dict[str, float] = field(default_factory=dict)
    """The mean over the group's completions of each named part of their rewards (a reward
    function's components, a reward model's or a judge's score), logged beside the reward."""


@dataclass(frozen=True)
class VersionAnnouncement:
    """A new policy version is ready to be pulled on the weight-sync channel."""

    KIND: ClassVar[str] = "version"
    policy_version: int
    num_bytes: int
    checksum: str
    transport: str
    endpoint: str
    layout: str = "runs"
    """How a version in shards cuts the weights: runs (replicas) or rows (fsdp)."""


@dataclass(frozen=True)
class Control:
    """A command to every worker of the run (e.g. stop)."""

    KIND: ClassVar[str] = "control"
    command: str
    args: dict[str, str]


@dataclass(frozen=True)
class Heartbeat:
    """A worker's liveness and status, also mirrored into the Redis registry."""

    KIND: ClassVar[str] = "heartbeat"
    role: str
    worker_id: str
    status: str
    counters: dict[str, float]


PAYLOAD_TYPES: dict[str, type] = {
    cls.KIND: cls for cls in (RolloutGroup, ScoredGroup, VersionAnnouncement, Control, Heartbeat)
}
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Envelope:
    """What every message looks like on the wire; `payload` is one of PAYLOAD_TYPES."""

    kind: str
    run_id: str
    sender: str
    policy_version: int
    payload: Any
    schema_version: int = SCHEMA_VERSION
    msg_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)


def make_envelope(payload: Any, *, run_id: str, sender: str, policy_version: int) -> Envelope:
    """Wrap a payload, taking the kind from its class."""
    return Envelope(
        kind=payload.KIND,
        run_id=run_id,
        sender=sender,
        policy_version=policy_version,
        payload=payload,
    )
