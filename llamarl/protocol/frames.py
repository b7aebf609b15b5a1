"""Validation of one bus message as it arrives: `[topic, envelope]` frames, for broker and clients.

The broker (on entry) and every bus client (on receipt) call `validate_frames` and nothing else,
so a message is accepted or refused for the same reasons everywhere: frame count, known topic,
decodable envelope within the size limit (`decode`), kind allowed on the topic, and this run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamarl.errors import ProtocolError
from llamarl.protocol.codec import decode
from llamarl.protocol.messages import Envelope


def validate_frames(
    frames: Sequence[bytes],
    topics: Mapping[str, frozenset[str]],
    run_id: str,
    max_message_bytes: int,
) -> tuple[str, Envelope]:
    """(topic, envelope) of a well-formed message of run `run_id` on one of `topics` (topic name
    to the kinds it may carry); raises ProtocolError whose `reason` is the rejection counter."""
    if len(frames) != 2:
        raise ProtocolError("bad_frames", f"{len(frames)} frames")
    topic = frames[0].decode("utf-8", "replace")
    kinds = topics.get(topic)
    if kinds is None:
        raise ProtocolError("unknown_topic", topic[:40])
    envelope = decode(frames[1], max_message_bytes)
    if envelope.kind not in kinds:
        raise ProtocolError("wrong_topic", f"{envelope.kind} on {topic}")
    if envelope.run_id != run_id:
        raise ProtocolError("wrong_run", envelope.run_id[:40])
    return topic, envelope
