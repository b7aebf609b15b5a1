"""The message bus: its interface, the ZeroMQ client of the broker, and an in-process hub.

`Bus` (with `Subscription` and `WorkQueue`) is what components depend on; `BusClient` talks to the
broker process (`brokers/broker.py`), `MemoryHub(...).client(sender)` gives a `MemoryBus` for tests
and single-process runs. Both validate every message with `llamarl.protocol.validate_frames`.
"""

from llamarl.bus.interfaces import Bus, Subscription, WorkQueue
from llamarl.bus.memory import MemoryBus, MemoryHub
from llamarl.bus.zmq_client import BusClient, Consumer, Subscriber, query_broker_stats

# mypy checks here that both implementations satisfy the interface.
IMPLEMENTATIONS: tuple[type[Bus], ...] = (BusClient, MemoryBus)

__all__ = [
    "Bus",
    "BusClient",
    "Consumer",
    "MemoryBus",
    "MemoryHub",
    "Subscriber",
    "Subscription",
    "WorkQueue",
    "query_broker_stats",
]
