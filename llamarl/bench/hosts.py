"""Two simulated hosts for `llamarl bench weight-sync --across-hosts`: a network namespace for the
trainer's processes and one for the generators', joined by a veth pair (a link like a cable
between two machines), so every weight crosses a real network link instead of loopback.

The bench's spawned processes enter their host's namespace first thing (`Placement.enter`,
setns(2) on the namespace `ip netns add` made); the trainer's weight servers bind its address.
The namespaces and the link are removed when the block ends. Needs root and `ip`; without them
the bench refuses in one line before anything starts.
"""

from __future__ import annotations

import ctypes
import os
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llamarl.errors import ConfigError

CLONE_NEWNET = 0x40000000
LINK = "veth"
"""The interface name each end of the link has inside its host."""


@dataclass(frozen=True)
class Placement:
    """Which namespace each side of the bench runs in, and the trainer host's address."""

    trainer_netns: str
    generator_netns: str
    trainer_address: str
    generator_address: str

    def enter(self, side: str) -> None:
        """Move this process (before it opens any socket) into `side`'s host: trainer or
        generator."""
        name = self.trainer_netns if side == "trainer" else self.generator_netns
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/var/run/netns/{name}") as namespace:
            if libc.setns(namespace.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def check_can_make_hosts() -> None:
    """ConfigError naming the flag when this machine cannot make network namespaces."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise ConfigError(
            "--across-hosts: two simulated hosts are network namespaces, which need root and "
            "`ip` (iproute2); run as root, or leave --across-hosts out"
        )


@contextmanager
def two_hosts() -> Iterator[Placement]:
    """A trainer host and a generator host joined by one link, removed at the end."""
    check_can_make_hosts()
    tag = secrets.token_hex(3)
    prefix = f"10.214.{random.randrange(256)}"
    placement = Placement(f"llbench{tag}t", f"llbench{tag}g", f"{prefix}.1", f"{prefix}.2")
    made: list[str] = []
    try:
        for name in (placement.trainer_netns, placement.generator_netns):
            _ip("netns", "add", name)
            made.append(name)
        _ip(
            "link",
            "add",
            f"llb{tag}t",
            "netns",
            placement.trainer_netns,
            "type",
            "veth",
            "peer",
            "name",
            f"llb{tag}g",
            "netns",
            placement.generator_netns,
        )
        ends = (
            (placement.trainer_netns, f"llb{tag}t", placement.trainer_address),
            (placement.generator_netns, f"llb{tag}g", placement.generator_address),
        )
        for netns, device, address in ends:
            _ip("-n", netns, "link", "set", device, "name", LINK)
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", LINK)
            _ip("-n", netns, "link", "set", LINK, "up")
            _ip("-n", netns, "link", "set", "lo", "up")
        yield placement
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
