"""Broker addressing and the one place ZeroMQ sockets are made (limits, linger, CURVE)."""

from __future__ import annotations

import fcntl
import socket
import struct
from dataclasses import dataclass

import zmq

from llamarl.curve import Curve

SIOCGIFADDR = 0x8915
"""Linux ioctl: an interface's IPv4 address."""


@dataclass(frozen=True)
class BrokerEndpoints:
    """The broker's four sockets live on consecutive ports starting at `port`."""

    host: str
    port: int

    def _tcp(self, offset: int) -> str:
        return f"tcp://{self.host}:{self.port + offset}"

    @property
    def pub_in(self) -> str:
        """Publishers connect here (broker XSUB)."""
        return self._tcp(0)

    @property
    def sub_out(self) -> str:
        """Subscribers connect here (broker XPUB)."""
        return self._tcp(1)

    @property
    def work_in(self) -> str:
        """Work producers connect here (broker PULL)."""
        return self._tcp(2)

    @property
    def work_out(self) -> str:
        """Work consumers connect here (broker ROUTER)."""
        return self._tcp(3)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def address_family(host: str) -> socket.AddressFamily:
    """IPv6 for an address with a colon, else IPv4."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def address_towards(host: str) -> str:
    """The address of this machine's interface that traffic to `host` (a name or an address)
    leaves from: the one a peer there can reach this machine at. A UDP connect sends nothing."""
    family, _, _, _, peer = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(peer)
        return str(probe.getsockname()[0])


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds IPv4 `address` (None: no such
    interface, or an IPv6 address)."""
    if address_family(address) != socket.AF_INET:
        return None
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
        if socket.inet_ntoa(answer[20:24]) == address:
            return name
    return None


def own_address(host: str) -> str | None:
    """`host` resolved, when it is an address of this machine's own that can be bound; None for
    a wildcard (0.0.0.0, ::) or an address that is not this machine's (behind NAT)."""
    try:
        family, _, _, _, where = socket.getaddrinfo(host, 0, type=socket.SOCK_DGRAM)[0]
    except socket.gaierror:
        return None
    address = str(where[0])
    if address in ("0.0.0.0", "::"):
        return None
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return None
    return address


def free_port_block(host: str = "127.0.0.1", size: int = 4, attempts: int = 50) -> int:
    """A base port whose `size` consecutive ports are free right now."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1]
        if base + size > 65535:
            continue
        held = []
        try:
            for offset in range(size):
                sock = socket.socket()
                held.append(sock)
                sock.bind((host, base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise OSError(f"no block of {size} free ports found on {host}")


def make_socket(
    ctx: zmq.Context,
    kind: int,
    hwm: int,
    curve: Curve | None = None,
    *,
    server: bool = False,
    max_message_bytes: int = -1,
) -> zmq.Socket:
    """A socket with explicit high-water marks and linger 0, so close never blocks; with `curve`,
    a CURVE server (binds; its context needs `curve.authenticator`) or client (connects). A peer
    that sends a message over `max_message_bytes` (-1: no limit) is disconnected by ZeroMQ
    before the message is buffered."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if curve is not None:
        (curve.server if server else curve.client)(sock)
    return sock
