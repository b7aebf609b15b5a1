"""What the in-process hub adds to the bus contract: its own refusal hook, bounded subscriptions,
and work left queued when a consumer closes."""

from __future__ import annotations

from llamarl.bus import MemoryHub
from llamarl.protocol import Control
from llamarl.topics import CONTROL, ROLLOUTS
from tests.factories import rollout_group


def test_hub_reports_refusals_to_its_hook_and_counts_them() -> None:
    refused: list[str] = []
    hub = MemoryHub("run", on_reject=lambda reason, detail: refused.append(reason))
    hub.push_frames([ROLLOUTS.encode(), b"\xc1"], timeout_s=0)
    hub.publish_frames([b"nosuchtopic", b""])
    assert refused == ["garbage", "unknown_topic"]
    assert hub.stats()["rejected"] == 2


def test_a_full_subscription_drops_newer_fanout_and_counts_it() -> None:
    hub = MemoryHub("run", hwm=3)
    bus = hub.client("s")
    sub = bus.subscribe([CONTROL])
    for index in range(5):
        bus.publish(CONTROL, Control("tick", {"i": str(index)}), 0)
    got = [message[1].payload.args["i"] for message in iter(lambda: sub.recv(0), None)]
    assert got == ["0", "1", "2"]
    assert hub.stats()["dropped.fanout"] == 2


def test_work_not_taken_stays_queued_for_the_next_consumer() -> None:
    hub = MemoryHub("run")
    bus = hub.client("p")
    bus.push(ROLLOUTS, rollout_group(1), 0)
    bus.consume(ROLLOUTS).close()
    envelope = hub.client("c").consume(ROLLOUTS).recv(0)
    assert envelope is not None and envelope.payload.ticket_id == 1
    assert hub.stats()["queued.rollouts"] == 0
