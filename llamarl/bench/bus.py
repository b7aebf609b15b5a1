"""`llamarl bench bus`: small messages through the broker against raw pyzmq, same machine, same run.

Three processes in every arm but the first: a producer, something in the middle, a consumer (on
a 2-core machine they share the cores, as a run's roles do).
- raw_direct: pyzmq PUSH -> PULL, bytes only, two processes (the transport's own limit).
- raw: pyzmq PUSH -> a plain Python forwarder (PULL -> PUSH, no checks) -> PULL; bytes only.
- work: `BusClient.push` of a small rollout group -> the broker (rate limit, envelope checks,
  credit-based dispatch) -> `Consumer.recv` (full decode and schema check) with credit `--credit`.
- fanout: `BusClient.publish` of a control message -> broker XSUB/XPUB -> `Subscriber.recv`;
  a publisher faster than its subscriber loses what finds the queue at the high-water mark, as
  PUB/SUB does: counted and reported.
Each arm sends `--messages` messages; throughput = messages received / (start to last receive).
Median of `--repeats` rounds, with min and max.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from typing import Any

import zmq

from llamarl.bench.stats import spread
from llamarl.bus import BusClient, query_broker_stats
from llamarl.net import BrokerEndpoints, free_port_block
from llamarl.protocol import Control, RolloutGroup, TypedArray, encode, make_envelope
from llamarl.topics import CONTROL, ROLLOUTS

RUN_ID = "bench-bus"
IDLE_END_S = 2.0
TIMEOUT_S = 120.0


def small_group(index: int) -> RolloutGroup:
    import numpy as np

    def array(values: Any, dtype: Any) -> TypedArray:
        return TypedArray.from_numpy(np.asarray(values, dtype=dtype))

    return RolloutGroup(
        rollout_id=f"{index}.0",
        ticket_id=index,
        attempt=0,
        prompt_index=index,
        prompt="1+2=",
        answer="3",
        prompt_tokens=array([3, 12, 4, 14], np.int32),
        completion_tokens=array([[5, 1]], np.int32),
        completion_lengths=array([2], np.int32),
        behaviour_logprobs=array([[-0.1, -0.2]], np.float32),
        token_versions=array([[0, 0]], np.int32),
        completions=array(list(b"3"), np.uint8),
    )


def message_bytes() -> int:
    envelope = make_envelope(small_group(0), run_id=RUN_ID, sender="producer", policy_version=0)
    return len(encode(envelope))


# -- raw pyzmq ---------------------------------------------------------------------------
def _raw_forwarder(port: int) -> None:
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(f"tcp://127.0.0.1:{port}")
    push.bind(f"tcp://127.0.0.1:{port + 1}")
    while True:
        frames = pull.recv_multipart()
        push.send_multipart(frames)
        if frames == [b"END"]:
            return


def _raw_producer(port: int, count: int, size: int, start) -> None:
    push = zmq.Context().socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    payload = b"x" * size
    push.send_multipart([b"warmup", payload])  # the consumer sees the path is up
    start.wait()
    for _ in range(count):
        push.send_multipart([b"rollouts", payload])
    push.send_multipart([b"END"])
    push.close(linger=-1)


def raw_round(count: int, size: int, forwarded: bool) -> float:
    """Raw pyzmq messages per second: through a plain forwarder process, or PUSH -> PULL."""
    ctx = mp.get_context("spawn")
    port = free_port_block(size=2)
    start = ctx.Event()
    forwarder = ctx.Process(target=_raw_forwarder, args=(port,))
    producer = ctx.Process(target=_raw_producer, args=(port, count, size, start))
    pull = zmq.Context().socket(zmq.PULL)
    if forwarded:
        forwarder.start()
        pull.connect(f"tcp://127.0.0.1:{port + 1}")
    else:
        pull.bind(f"tcp://127.0.0.1:{port}")
    producer.start()
    assert pull.recv_multipart()[0] == b"warmup"
    start.set()
    started = time.perf_counter()
    received = 0
    while pull.recv_multipart() != [b"END"]:
        received += 1
    elapsed = time.perf_counter() - started
    for proc in (producer, forwarder) if forwarded else (producer,):
        proc.join(TIMEOUT_S)
    pull.close(linger=0)
    assert received == count
    return count / elapsed


# -- through the broker --------------------------------------------------------------------
def _send(bus: BusClient, pattern: str, payload: Any) -> None:
    if pattern == "work":
        bus.push(ROLLOUTS, payload, 0)
    else:
        bus.publish(CONTROL, payload, 0)


def _bus_producer(endpoints: BrokerEndpoints, pattern: str, count: int, start) -> None:
    bus = BusClient(endpoints, run_id=RUN_ID, sender="producer")
    warmup: Any
    payloads: list[Any]
    if pattern == "work":
        warmup, payloads = small_group(-1), [small_group(i) for i in range(64)]
    else:
        warmup, payloads = Control("warmup", {}), [Control("bench", {})] * 64
    # Until the consumer has seen one arrive (subscriptions and credits have reached the broker).
    while not start.wait(0.05):
        _send(bus, pattern, warmup)
    for index in range(count):
        _send(bus, pattern, payloads[index % 64])
    bus.close()


def _is_warmup(message: Any) -> bool:
    payload = message.payload if hasattr(message, "payload") else message[1].payload
    return getattr(payload, "ticket_id", 0) == -1 or getattr(payload, "command", "") == "warmup"


def broker_round(endpoints: BrokerEndpoints, pattern: str, count: int, credit: int) -> tuple[float, int]:
    """(messages per second, messages lost). Work loses none (backpressure); fan-out drops what
    finds a subscriber's queue at its high-water mark, so its round ends when none has come for
    IDLE_END_S."""
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    bus = BusClient(endpoints, run_id=RUN_ID, sender="consumer")
    receiver: Any = bus.consume(ROLLOUTS, credit=credit) if pattern == "work" else bus.subscribe([CONTROL])
    producer = ctx.Process(target=_bus_producer, args=(endpoints, pattern, count, start))
    producer.start()
    if receiver.recv(int(TIMEOUT_S * 1000)) is None:
        raise TimeoutError(f"{pattern}: the broker path never came up")
    start.set()
    started = last = time.perf_counter()
    received = 0
    wait_ms = int((TIMEOUT_S if pattern == "work" else IDLE_END_S) * 1000)
    while received < count:
        message = receiver.recv(wait_ms)
        if message is None:
            if pattern == "work":
                raise TimeoutError(f"{pattern}: {received} of {count} messages arrived")
            break
        last = time.perf_counter()
        received += not _is_warmup(message)
    producer.join(TIMEOUT_S)
    bus.close()
    return received / (last - started), count - received


def start_broker(endpoints: BrokerEndpoints) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "LLAMARL_BROKER": str(endpoints),
        "LLAMARL_RUN_ID": RUN_ID,
        "LLAMARL__BROKER__RATE_LIMIT_PER_S": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "brokers", "--log-format", "json"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            query_broker_stats(endpoints, timeout_s=0.5)
            return proc
        except TimeoutError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise


def bench(count: int, repeats: int, credit: int) -> dict[str, Any]:
    size = message_bytes()
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    broker = start_broker(endpoints)
    rates: dict[str, list[float]] = {"raw_direct": [], "raw": [], "work": [], "fanout": []}
    lost = {"work": 0, "fanout": 0}
    try:
        for _ in range(repeats):  # interleaved: raw, work, fanout, raw, ...
            rates["raw_direct"].append(raw_round(count, size, forwarded=False))
            rates["raw"].append(raw_round(count, size, forwarded=True))
            for pattern in ("work", "fanout"):
                rate, missing = broker_round(endpoints, pattern, count, credit)
                rates[pattern].append(rate)
                lost[pattern] += missing
    finally:
        broker.terminate()
        broker.wait(30)
    raw = spread(rates["raw"], 0)["median"]
    return {
        "messages": count,
        "message_bytes": size,
        "credit": credit,
        "raw_direct_msgs_per_s": spread(rates["raw_direct"], 0),
        "raw_msgs_per_s": spread(rates["raw"], 0),
        "work_msgs_per_s": spread(rates["work"], 0),
        "fanout_msgs_per_s": spread(rates["fanout"], 0),
        "work_lost": lost["work"],
        "fanout_dropped_at_hwm": lost["fanout"],
        "work_vs_raw": round(spread(rates["work"], 0)["median"] / raw, 3),
        "fanout_vs_raw": round(spread(rates["fanout"], 0)["median"] / raw, 3),
    }
