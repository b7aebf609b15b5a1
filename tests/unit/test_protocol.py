"""Protocol: every kind round-trips; any other bytes give ProtocolError and nothing else."""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamarl.errors import ProtocolError
from llamarl.protocol import Control, TypedArray, decode, encode, make_envelope
from tests.factories import every_kind

REPO = Path(__file__).resolve().parents[2]
LIMIT = 1 << 20


def _frame(payload: object) -> bytes:
    return encode(make_envelope(payload, run_id="r1", sender="gen-0", policy_version=4))


@pytest.mark.parametrize("payload", every_kind(), ids=lambda p: type(p).__name__)
def test_every_kind_round_trips(payload: object) -> None:
    envelope = make_envelope(payload, run_id="r1", sender="gen-0", policy_version=4)
    decoded = decode(encode(envelope), LIMIT)
    assert decoded == envelope
    assert decoded.kind == type(payload).KIND  # type: ignore[attr-defined]


def test_arrays_travel_as_typed_bytes() -> None:
    values = np.array([[-0.5, -1.25], [-2.0, -0.125]], dtype=np.float32)
    wire = msgpack.unpackb(encode(make_envelope(every_kind()[0], run_id="r", sender="s", policy_version=0)))
    assert isinstance(wire["payload"]["behaviour_logprobs"]["data"], bytes)
    assert np.array_equal(TypedArray.from_numpy(values).to_numpy(), values)


def test_timestamps_and_ids_are_fresh_per_message() -> None:
    """A default evaluated once (at import) would give both the same id and a time before now."""
    before = time.time()
    first, second = (make_envelope(Control("x", {}), run_id="r", sender="s", policy_version=0) for _ in range(2))
    after = time.time()
    assert first.msg_id != second.msg_id
    assert before <= first.created_at <= second.created_at <= after


def _mutate(wire: dict, path: list[str], value: object) -> bytes:
    node = wire
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return msgpack.packb(wire, use_bin_type=True)


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (["kind"], "mystery", "unknown_kind"),
        (["schema_version"], 99, "unknown_version"),
        (["policy_version"], "4", "bad_schema"),
        (["payload", "ticket_id"], True, "bad_schema"),
        (["payload", "completion_tokens", "dtype"], "object", "bad_array"),
        (["payload", "completion_tokens", "shape"], [1000, 1000], "bad_array"),
        (["payload", "extra"], 1, "bad_schema"),
    ],
)
def test_wrong_fields_are_protocol_errors(path: list[str], value: object, reason: str) -> None:
    wire = msgpack.unpackb(_frame(every_kind()[0]), raw=False)
    with pytest.raises(ProtocolError) as caught:
        decode(_mutate(wire, path, value), LIMIT)
    assert caught.value.reason == reason


def test_oversize_is_refused_before_decoding() -> None:
    frame = _frame(every_kind()[0])
    with pytest.raises(ProtocolError) as caught:
        decode(frame, len(frame) - 1)
    assert caught.value.reason == "oversize"


def test_extension_types_are_refused() -> None:
    with pytest.raises(ProtocolError):
        decode(msgpack.packb(msgpack.ExtType(1, b"x")), LIMIT)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes_only_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(data, LIMIT)


VALID_FRAMES = [_frame(p) for p in every_kind()]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(VALID_FRAMES),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 10_000),
)
def test_mutated_frames_only_raise_protocol_error(frame: bytes, flips: list, cut: int) -> None:
    data = bytearray(frame)
    for position, byte in flips:
        data[position % len(data)] = byte
    data = data[: max(1, len(data) - cut % 8)]
    try:
        decode(bytes(data), LIMIT)
    except ProtocolError:
        pass  # the only acceptable failure; anything else propagates and fails the test


def test_no_pickle_or_eval_in_shipped_code() -> None:
    pattern = re.compile(r"\bimport pickle\b|\bpickle\.|\bcloudpickle\b|(?<![\w.])eval\(")
    offenders = [
        str(path.relative_to(REPO))
        for package in ("llamarl", "brokers", "workers")
        for path in (REPO / package).rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert offenders == []
