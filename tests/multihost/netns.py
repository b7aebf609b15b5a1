"""A cluster of simulated hosts on one machine: each host is a network namespace with its own
address, hostname and /dev/shm, joined to the others by a bridge; the machine itself sits on the
bridge too, so a test can reach every host.

A host is a long-lived holder process made with `unshare` inside `ip netns exec`: its own
network, UTS (hostname) and mount namespaces, with a private tmpfs on /dev/shm and /tmp/ray, so
what one host writes to shared memory (or Ray to its sockets) another cannot see, as across
machines. Processes join a host with
`nsenter` on the holder's pid. Everything else (the filesystem, the Python environment) is shared,
as a cluster's shared filesystem is.

Addresses come from a /24 in 10.213.0.0/16 that no route of the machine uses, and every name
carries a random tag, so two clusters (two test workers) never collide. `Cluster.close` stops
only the processes it started, by pid, then removes the namespaces and the bridge, whatever
happened before. Links are cut and restored with `ip link set`; loss, rate limits and
reordering are applied with iptables and tc on a host's end of its link. Needs root and `ip`.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

HOLDER = (
    "mount -t tmpfs -o size=2g tmpfs /dev/shm && hostname {name} && "
    "mkdir -p /tmp/ray && mount -t tmpfs tmpfs /tmp/ray && "
    "mount --bind {etc}/hosts /etc/hosts && mount --bind {etc}/resolv.conf /etc/resolv.conf && "
    "echo ready && exec sleep infinity"
)
"""A host's holder: its own /dev/shm, /tmp/ray (Ray's sockets and session files) and hostname,
and the cluster's names in /etc/hosts (no name server: a lookup of anything else fails at once
instead of timing out)."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _free_subnet() -> str:
    """A 10.213.X prefix no route of this machine covers."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    taken = {line.split()[0] for line in routes.splitlines() if line.startswith("10.213.")}
    free = [f"10.213.{x}" for x in range(256) if f"10.213.{x}.0/24" not in taken]
    return random.choice(free)


def available() -> str | None:
    """Why this machine cannot make a cluster, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "nsenter", "iptables"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} is not installed"
    return None


@dataclass
class Host:
    """One simulated machine: its namespace, address and holder process."""

    name: str
    netns: str
    address: str
    link: str  # the host's end of its veth pair, inside its namespace
    holder: subprocess.Popen[bytes] | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def enter(self) -> list[str]:
        """The command prefix that runs a program on this host, in this process's directory."""
        assert self.holder is not None
        return [
            "nsenter",
            "-t",
            str(self.holder.pid),
            "-n",
            "-m",
            "-u",
            f"--wd={os.getcwd()}",
            "--",
        ]

    def run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a short command on this host to its end."""
        return subprocess.run([*self.enter(), *argv], capture_output=True, text=True, timeout=timeout)

    def start(
        self, argv: Sequence[str], env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a long-running process on this host in a process group of its own; its output
        goes to `log` (appended). The cluster stops it by pid when it closes."""
        out: IO[bytes] | int = open(log, "ab") if log else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                [*self.enter(), *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        self.processes.append(proc)
        return proc


class Cluster:
    """Hosts named `names` on one bridge; a context manager that removes them all on exit."""

    def __init__(self, names: Sequence[str]) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"llbr{self.tag}"
        prefix = _free_subnet()
        self.gateway = f"{prefix}.1"
        self.etc = Path(tempfile.mkdtemp(prefix=f"llamarl-hosts-{self.tag}-"))
        self.hosts = {
            name: Host(name, f"ll{self.tag}{name}", f"{prefix}.{i + 2}", "eth0") for i, name in enumerate(names)
        }

    def __enter__(self) -> Cluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _build(self) -> None:
        names = "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        (self.etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        (self.etc / "resolv.conf").write_text("")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts.values():
            outside = f"v{self.tag}{host.name}"[:15]
            _ip("netns", "add", host.netns)
            _ip(
                "link",
                "add",
                outside,
                "type",
                "veth",
                "peer",
                "name",
                host.link,
                "netns",
                host.netns,
            )
            _ip("link", "set", outside, "master", self.bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.link)
            _ip("-n", host.netns, "link", "set", host.link, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "route", "add", "default", "via", self.gateway)
            holder = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    host.netns,
                    "unshare",
                    "--mount",
                    "--uts",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    HOLDER.format(name=host.name, etc=self.etc),
                ],
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            host.holder = holder
            assert holder.stdout is not None
            if holder.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"host {host.name} did not start")

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts a and b, both ways (a partition of that pair)."""
        for one, other in ((a, b), (b, a)):
            self._iptables(one, "-A", other)

    def heal(self, a: str, b: str) -> None:
        """Undo `cut(a, b)`."""
        for one, other in ((a, b), (b, a)):
            self._iptables(one, "-D", other)

    def _iptables(self, host: str, action: str, peer: str) -> None:
        address = self.hosts[peer].address
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
            done = self.hosts[host].run(["iptables", action, chain, flag, address, "-j", "DROP"])
            assert done.returncode == 0, done.stderr

    def lossy(self, host: str, peer: str, probability: float) -> None:
        """Drop each packet from `host` to `peer` with this probability (iptables statistic)."""
        done = self.hosts[host].run(
            [
                "iptables",
                "-A",
                "OUTPUT",
                "-d",
                self.hosts[peer].address,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                str(probability),
                "-j",
                "DROP",
            ]
        )
        assert done.returncode == 0, done.stderr

    def close(self) -> None:
        """Stop every process this cluster started (by pid, its process group), then remove the
        namespaces and the bridge. Safe to call twice and after a failed build."""
        for host in self.hosts.values():
            for proc in host.processes:
                _stop(proc)
            if host.holder is not None:
                for pid in _in_namespace(host.holder.pid):  # daemons that left the group (Ray)
                    _kill(pid)
                _stop(host.holder)
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.etc, ignore_errors=True)


def kill_namespace(host: Host) -> None:
    """SIGKILL every process on `host` but its holder: the host's power cut."""
    assert host.holder is not None
    for pid in _in_namespace(host.holder.pid):
        _kill(pid)
    for proc in host.processes:
        proc.wait(30)


def _in_namespace(holder_pid: int) -> list[int]:
    """The pids in the network namespace of `holder_pid` (a host's), the holder aside: every
    one was started by this cluster, since the namespace is its own."""
    try:
        namespace = os.readlink(f"/proc/{holder_pid}/ns/net")
    except OSError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != holder_pid:
            try:
                if os.readlink(entry / "ns" / "net") == namespace:
                    pids.append(int(entry.name))
            except OSError:
                continue  # exited meanwhile
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group this cluster started, then SIGKILL what is left of it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group's stragglers too
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(30)
