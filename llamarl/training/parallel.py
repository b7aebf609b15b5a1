"""A data-parallel trainer: the ranks torchrun starts, their process group, and rank 0's orders.

`TrainerRanks.from_env()` joins the group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK) with gloo for CPU tensors and NCCL for CUDA ones. Rank 0 is the
trainer the rest of the run sees: it gathers scored groups, keeps the ledger, evaluates,
checkpoints and announces versions. The other ranks follow its orders (`llamarl.roles.
trainer_follower`): rank 0 broadcasts each step's groups, as wire-protocol envelopes in one
msgpack frame (never pickle), and each version to publish; sharded ranks (fsdp) are also told
when to evaluate and checkpoint, which need every rank's shards. Every rank trains on its share
of the groups (`mine`); the gradients are reduced in the last micro-batch's backward pass
(`llamarl.training.sharding`: replicas stay equal bit for bit, shards stay each rank's part of
one model). Each rank then sends its own shard of a version to the generators.

A follower waits for the next order up to `trainer.ranks_timeout_s` (rank 0 may be waiting for
rollouts, evaluating or checkpointing meanwhile); when any rank dies torchrun ends the others,
and the launcher restarts them all from the newest checkpoint. torchrun sees only the ranks of
its own host, so rank 0, while it waits for rollouts, sends a `check` (nothing to do) once it has
sent nothing for a heartbeat (`check_ranks`): a rank that died on another host makes it fail,
instead of every rank waiting for the next order while generators wait for their weights.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack
import structlog
import torch
import torch.distributed as dist

from llamarl.errors import ProtocolError
from llamarl.net import address_towards, interface_of
from llamarl.protocol import ScoredGroup, decode, encode, make_envelope

log = structlog.get_logger(__name__)
MAX_ORDER_BYTES = 1 << 31
OPS = ("step", "publish", "evaluate", "checkpoint", "check", "stop")


@dataclass(frozen=True)
class Order:
    """What rank 0 tells the other ranks: train a step on `groups`, publish `policy_version`,
    evaluate or write the checkpoint of `step` with it (sharded ranks only: both need every
    rank's shards), check that every rank is there (nothing to do), or stop."""

    op: str
    step: int = 0
    policy_version: int = -1
    groups: tuple[ScoredGroup, ...] = ()


def _encode_order(order: Order, run_id: str) -> bytes:
    frames = [encode(make_envelope(g, run_id=run_id, sender="trainer", policy_version=0)) for g in order.groups]
    wire = {"op": order.op, "step": order.step, "policy_version": order.policy_version, "groups": frames}
    return bytes(msgpack.packb(wire, use_bin_type=True))


def _decode_order(data: bytes) -> Order:
    wire = msgpack.unpackb(data, raw=False, strict_map_key=True)
    if type(wire) is not dict or wire.keys() != {"op", "step", "policy_version", "groups"}:
        raise ProtocolError("bad_schema", "a trainer order is {op, step, policy_version, groups}")
    if wire["op"] not in OPS:
        raise ProtocolError("unknown_kind", f"trainer order {str(wire['op'])[:40]!r}")
    groups = tuple(decode(frame, MAX_ORDER_BYTES).payload for frame in wire["groups"])
    if not all(isinstance(g, ScoredGroup) for g in groups):
        raise ProtocolError("bad_schema", "a trainer order carries scored groups only")
    return Order(str(wire["op"]), int(wire["step"]), int(wire["policy_version"]), groups)


CLOSE_WAIT_S = 30.0


def choose_gloo_interface(environ: MutableMapping[str, str]) -> None:
    """Set GLOO_SOCKET_IFNAME, unless it is set, to the interface that reaches MASTER_ADDR (rank
    0's host, set by torchrun): gloo's own choice resolves this host's name, and where that
    fails or gives loopback the ranks of another host cannot reach this one."""
    if "GLOO_SOCKET_IFNAME" in environ or "MASTER_ADDR" not in environ:
        return
    try:
        interface = interface_of(address_towards(environ["MASTER_ADDR"]))
    except OSError:  # MASTER_ADDR does not resolve here: gloo's own choice will say so
        return
    if interface is not None:
        environ["GLOO_SOCKET_IFNAME"] = interface


class TrainerRanks:
    """This process's place in the trainer's data-parallel group."""

    def __init__(self, rank: int, world: int, device: torch.device, run_id: str) -> None:
        self.rank = rank
        self.world = world
        self.device = device
        self.run_id = run_id
        self.last_sent = time.monotonic()
        """When rank 0 last sent an order (`check_ranks`)."""

    @classmethod
    def from_env(cls, device: str, timeout_s: float, run_id: str) -> TrainerRanks | None:
        """Join the group torchrun set up; None for a trainer of one process."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
        choose_gloo_interface(os.environ)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        where = torch.device("cpu")
        if device == "cuda":
            where = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(where)
        return cls(dist.get_rank(), dist.get_world_size(), where, run_id)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def mine(self, count: int) -> list[int]:
        """The indices of a step's `count` groups this rank trains on."""
        return list(range(self.rank, count, self.world))

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, op=op)
        return [float(v) for v in tensor]

    def send(self, order: Order) -> None:
        """Rank 0: broadcast an order to every other rank."""
        self._broadcast(_encode_order(order, self.run_id))
        self.last_sent = time.monotonic()

    def check_ranks(self, every_s: float) -> None:
        """Rank 0, waiting: a `check` order when none has gone out for `every_s`; it raises
        when a rank has died (a torchrun of another host cannot tell this one)."""
        if time.monotonic() - self.last_sent >= every_s:
            self.send(Order("check"))

    def receive(self) -> Order:
        """Another rank: the next order from rank 0 (waits up to trainer.ranks_timeout_s)."""
        return _decode_order(self._broadcast(None))

    def _broadcast(self, frame: bytes | None) -> bytes:
        size = torch.tensor([len(frame) if frame is not None else 0], dtype=torch.int64)
        dist.broadcast(size, 0)
        data = (
            torch.frombuffer(bytearray(frame), dtype=torch.uint8)
            if frame is not None
            else torch.empty(int(size[0]), dtype=torch.uint8)
        )
        dist.broadcast(data, 0)
        return data.numpy().tobytes()

    def stop_others(self) -> None:
        """Rank 0: tell the other ranks to end (they may be gone already: then nothing)."""
        try:
            self.send(Order("stop"))
        except (RuntimeError, dist.DistError) as err:
            log.warning("could not stop the other trainer ranks", error=str(err)[:160])

    def close(self, wait: bool = True) -> None:
        """Leave the group, at the end of a run once every rank is here (up to CLOSE_WAIT_S): a
        rank that tore its group down while another still talked to it made that one abort
        ("terminate called without an active exception"). A rank that never comes (it died) is
        not waited for. After a failure (`wait` False) it leaves at once: a rank waiting for the
        others here kept open the sockets that another rank, still in a collective with it,
        needed to see closed to fail too (it waited `trainer.ranks_timeout_s`, an hour)."""
        if not dist.is_initialized():
            return
        if wait:
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=CLOSE_WAIT_S))
            except RuntimeError as err:
                log.warning("trainer ranks did not all reach the end", error=str(err)[:200])
        dist.destroy_process_group()


@contextmanager
def leaving(ranks: TrainerRanks | None) -> Iterator[None]:
    """Leave the group when the block ends: with the other ranks when it ended, at once when
    it raised (`TrainerRanks.close`). Nothing for a trainer of one process (None)."""
    if ranks is None:
        yield
        return
    try:
        yield
    except BaseException:
        ranks.close(wait=False)
        raise
    ranks.close()
