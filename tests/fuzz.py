"""Messages a receiver must refuse, for fuzzing the broker's endpoints and the workers' inputs.

Random bytes, truncated and byte-flipped envelopes, wrong frame counts, oversize frames, unknown
topics, kinds on the wrong topic and other runs' envelopes. Every message is invalid by
construction; byte-flipped ones are kept only when the real decoder refuses them (a flip inside a
number can leave a valid envelope, which a receiver rightly accepts).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import msgpack

from llamarl.errors import ProtocolError
from llamarl.protocol import decode, encode, make_envelope
from llamarl.topics import FANOUT_TOPICS, WORK_TOPICS
from tests.factories import every_kind

ALL_TOPICS = FANOUT_TOPICS | WORK_TOPICS


def _envelopes(run_id: str) -> list[bytes]:
    return [encode(make_envelope(payload, run_id=run_id, sender="fuzz", policy_version=1)) for payload in every_kind()]


def _refused(topic: bytes, payload: bytes, run_id: str, max_bytes: int) -> bool:
    try:
        envelope = decode(payload, max_bytes)
    except ProtocolError:
        return True
    kinds = ALL_TOPICS.get(topic.decode("utf-8", "replace"))
    return kinds is None or envelope.kind not in kinds or envelope.run_id != run_id


def bad_messages(
    count: int,
    *,
    topic: str,
    run_id: str,
    max_bytes: int,
    seed: int = 0,
    subscribed: bool = False,
    oversize: bool = True,
) -> Iterator[list[bytes]]:
    """`count` [topic, payload]-shaped messages that a receiver of `topic` must reject. For a
    `subscribed` receiver (SUB) none has another topic: libzmq filters those out before any
    code of ours sees them. Without `oversize`, no frame is over `max_bytes`: a receiver whose
    socket has ZeroMQ's maximum message size drops such a frame (and disconnects its sender)
    before any code of ours sees it."""
    rng = random.Random(seed)
    valid = _envelopes(run_id)
    foreign = _envelopes("another-run")
    name = topic.encode()
    wrong_kind = [
        v for v, payload in zip(valid, every_kind(), strict=True) if type(payload).KIND not in ALL_TOPICS[topic]
    ]
    made = 0
    while made < count:
        base = rng.choice(valid)
        kind = rng.randrange(9)
        if (kind == 5 and subscribed) or (kind == 4 and not oversize):
            continue
        if kind == 0:
            message = [name, rng.randbytes(rng.randrange(0, 300))]
        elif kind == 1:
            message = [name, base[: rng.randrange(0, len(base))]]
        elif kind == 2:
            flipped = bytearray(base)
            for _ in range(rng.randrange(1, 5)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            message = [name, bytes(flipped)]
            if not _refused(name, message[1], run_id, max_bytes):
                continue
        elif kind == 3:
            message = [name] if rng.random() < 0.5 else [name, base, rng.randbytes(8)]
        elif kind == 4:
            message = [name, rng.randbytes(max_bytes + 1)]
        elif kind == 5:
            message = [b"no-such-topic-" + rng.randbytes(4).hex().encode(), base]
        elif kind == 6:
            message = [name, rng.choice(wrong_kind)]
        elif kind == 7:
            message = [name, rng.choice(foreign)]
        else:
            junk = {"kind": "rollout_group", "payload": [1, 2, 3], "x": rng.random()}
            message = [name, msgpack.packb(junk)]
        made += 1
        yield message


def bad_commands(count: int, seed: int = 0) -> Iterator[list[bytes]]:
    """Frames a consumer might send the broker's work socket that are not valid commands."""
    rng = random.Random(seed)
    made = 0
    while made < count:
        kind = rng.randrange(4)
        if kind == 0:
            message = [rng.randbytes(rng.randrange(1, 40)) for _ in range(rng.randrange(1, 4))]
        elif kind == 1:
            message = [b"READY", b"rollouts", rng.randbytes(3)]
        elif kind == 2:
            message = [b"CREDIT", b"nope-" + rng.randbytes(3).hex().encode(), b"1"]
        else:
            message = [b"READY", b"rollouts"]
        if message[0] in (b"READY", b"CREDIT", b"STATS") and kind == 0:
            continue
        if kind == 1 and message[2].isdigit():
            continue
        made += 1
        yield message


def bad_subscriptions(count: int, seed: int = 0) -> Iterator[list[bytes]]:
    """Notices a subscriber might send the broker's XPUB that are not valid subscriptions. One
    frame each: libzmq consumes a frame starting with 0x00 (unsubscribe) itself and splits
    multi-frame notices, so neither is sent."""
    rng = random.Random(seed)
    for index in range(count):
        if index % 2:
            yield [bytes([rng.randrange(2, 256)]) + rng.randbytes(rng.randrange(0, 30))]
        else:
            yield [b"\x01nosuch-" + rng.randbytes(4).hex().encode()]


def bad_sync_requests(count: int, seed: int = 0) -> Iterator[list[bytes]]:
    """Requests to the trainer's weight server that are not [b"", msgpack {"worker_id": str, "group": str}]."""
    rng = random.Random(seed)
    for index in range(count):
        kind = index % 4
        if kind == 0:
            yield [b"", rng.randbytes(rng.randrange(0, 60))]
        elif kind == 1:
            yield [b"", msgpack.packb({"worker_id": rng.randrange(100)})]
        elif kind == 2:
            yield [rng.randbytes(5)]
        else:
            yield [b"", msgpack.packb({"worker_id": "x"}), b"extra"]
