"""The wire protocol: typed msgpack envelopes with explicit per-kind schemas (never pickle)."""

from llamarl.protocol.arrays import TypedArray
from llamarl.protocol.codec import decode, encode
from llamarl.protocol.frames import validate_frames
from llamarl.protocol.messages import (
    Control,
    Envelope,
    Heartbeat,
    RolloutGroup,
    ScoredGroup,
    VersionAnnouncement,
    make_envelope,
    trainable_reward,
)

__all__ = [
    "Control",
    "Envelope",
    "Heartbeat",
    "RolloutGroup",
    "ScoredGroup",
    "TypedArray",
    "VersionAnnouncement",
    "decode",
    "encode",
    "make_envelope",
    "trainable_reward",
    "validate_frames",
]
