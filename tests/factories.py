"""Sample payloads of every message kind, shared by protocol, broker and fuzz tests."""

from __future__ import annotations

import numpy as np

from llamarl.protocol import (
    Control,
    Heartbeat,
    RolloutGroup,
    ScoredGroup,
    TypedArray,
    VersionAnnouncement,
)


def rollout_group(ticket_id: int = 3, num_samples: int = 2, length: int = 4) -> RolloutGroup:
    rng = np.random.default_rng(ticket_id)
    return RolloutGroup(
        rollout_id=f"t{ticket_id}-a0",
        ticket_id=ticket_id,
        attempt=0,
        prompt_index=ticket_id,
        prompt="12+34=",
        answer="46",
        prompt_tokens=TypedArray.from_numpy(np.array([1, 2, 3], dtype=np.int32)),
        completion_tokens=TypedArray.from_numpy(rng.integers(0, 15, (num_samples, length)).astype(np.int32)),
        completion_lengths=TypedArray.from_numpy(np.full(num_samples, length, dtype=np.int32)),
        behaviour_logprobs=TypedArray.from_numpy(-rng.random((num_samples, length)).astype(np.float32)),
        token_versions=TypedArray.from_numpy(np.zeros((num_samples, length), dtype=np.int32)),
        completions=TypedArray.from_numpy(np.frombuffer(b"46\x0047", dtype=np.uint8)),
    )


def every_kind() -> list[object]:
    group = rollout_group()
    return [
        group,
        ScoredGroup(
            group=group,
            rewards=TypedArray.from_numpy(np.array([1.0, 0.0], np.float32)),
            scorer="exact_int",
        ),
        VersionAnnouncement(
            policy_version=7,
            num_bytes=1024,
            checksum="ab12",
            transport="gloo",
            endpoint="tcp://127.0.0.1:1234",
        ),
        Control(command="stop", args={"reason": "test"}),
        Heartbeat(role="generator", worker_id="gen-0", status="running", counters={"busy_s": 1.5}),
    ]


class FakeClock:
    """A clock that moves only when the test advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
