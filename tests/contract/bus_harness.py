"""One bus implementation set up for the contract tests: clients, raw frame injection, counters.

`ZmqHarness` runs a real broker process on free ports; `MemoryHarness` a MemoryHub. Both create
clients of run "test", inject raw frames where a producer would send them (to check refusals),
and read the refusal counters the broker keeps (STATS) or the hub keeps (`stats()`).
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from llamarl.bus import Bus, BusClient, MemoryHub, query_broker_stats
from llamarl.launch import supervise
from llamarl.limits import RejectHook
from llamarl.protocol import Control, encode, make_envelope
from llamarl.topics import CONTROL
from tests.conftest import start_broker_process

RUN_ID = "test"


class ZmqHarness:
    def __init__(self, max_queue: int, hwm: int) -> None:
        limits = {"LLAMARL__BROKER__MAX_QUEUE": str(max_queue), "LLAMARL__BROKER__HWM": str(hwm)}
        broker = start_broker_process(limits)
        self.endpoints, self.proc = broker.endpoints, broker.process
        self.hwm = hwm
        self.ctx = zmq.Context()
        self.clients: list[BusClient] = []
        self._push: zmq.Socket | None = None
        self._pub: zmq.Socket | None = None

    def client(self, sender: str, on_reject: RejectHook | None = None, **kw: Any) -> Bus:
        client = BusClient(self.endpoints, run_id=RUN_ID, sender=sender, hwm=self.hwm, on_reject=on_reject, **kw)
        self.clients.append(client)
        return client

    def inject_work(self, frames: list[bytes]) -> None:
        if self._push is None:
            self._push = self.ctx.socket(zmq.PUSH)
            self._push.connect(self.endpoints.work_in)
        self._push.send_multipart(frames)

    def inject_fanout(self, frames: list[bytes]) -> None:
        if self._pub is None:
            self._pub = self.ctx.socket(zmq.PUB)
            self._pub.connect(self.endpoints.pub_in)
            self._wait_pub_ready(self._pub)
        self._pub.send_multipart(frames)

    def _wait_pub_ready(self, pub: zmq.Socket) -> None:
        """Ready handshake for the slow joiner: send valid messages until one comes through."""
        listener = self.client("ready-check")
        sub = listener.subscribe([CONTROL])
        payload = encode(make_envelope(Control("ready", {}), run_id=RUN_ID, sender="raw", policy_version=0))
        deadline = time.monotonic() + 10
        while sub.recv(20) is None:
            assert time.monotonic() < deadline, "the raw publisher never became ready"
            pub.send_multipart([CONTROL.encode(), payload])
        sub.close()

    def stats(self) -> dict[str, int]:
        return query_broker_stats(self.endpoints)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.ctx.destroy(linger=0)
        assert supervise.stop(self.proc) == 0


class MemoryHarness:
    def __init__(self, max_queue: int, hwm: int) -> None:
        self.hub = MemoryHub(RUN_ID, max_queue=max_queue, hwm=hwm)
        self.clients: list[Bus] = []

    def client(self, sender: str, on_reject: RejectHook | None = None, **kw: Any) -> Bus:
        client = self.hub.client(sender, on_reject=on_reject, **kw)
        self.clients.append(client)
        return client

    def inject_work(self, frames: list[bytes]) -> None:
        self.hub.push_frames(frames, timeout_s=1.0)

    def inject_fanout(self, frames: list[bytes]) -> None:
        self.hub.publish_frames(frames)

    def stats(self) -> dict[str, int]:
        return self.hub.stats()

    def close(self) -> None:
        for client in self.clients:
            client.close()


Harness = ZmqHarness | MemoryHarness


def open_harness(kind: str, max_queue: int = 10_000, hwm: int = 1000) -> Harness:
    return ZmqHarness(max_queue, hwm) if kind == "zmq" else MemoryHarness(max_queue, hwm)
