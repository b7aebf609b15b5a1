"""torchrun command lines for a trainer whose ranks span hosts: a c10d rendezvous on the first
host, each host's agent announcing its own address (`--local-addr`), as docs/scaling-out.md
tells a user to start them."""

from __future__ import annotations

import sys

RENDEZVOUS_PORT = 29400


def multi_node(rendezvous_host: str, local_address: str, nodes: int, per_node: int, *, restarts: int = 0) -> list[str]:
    """The torchrun prefix of one host of `nodes`, each with `per_node` ranks."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous_host}:{RENDEZVOUS_PORT}",
        "--rdzv-id=multihost",
        f"--local-addr={local_address}",
        f"--max-restarts={restarts}",
    ]


def one_node(per_node: int) -> list[str]:
    """The torchrun prefix of `per_node` ranks on one host (its own rendezvous)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={per_node}",
    ]
