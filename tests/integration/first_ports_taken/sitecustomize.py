"""Loaded through PYTHONPATH (`tests.integration.async_helpers.first_ports_taken`) into every
process of a run: the first block of ports `llamarl.net.free_port_block` returns in a process is
taken (bound and listening) before its caller can bind it, as a parallel process could take it,
and noted as `pid size base` in the file `LLAMARL_TEST_TAKEN_PORTS` names."""

from __future__ import annotations

import os
import socket

from llamarl import net

_choose = net.free_port_block
_held: list[socket.socket] = []


def _first_block_taken(host: str = "127.0.0.1", size: int = 4, attempts: int = 50) -> int:
    base = _choose(host, size, attempts)
    if _held:
        return base
    for offset in range(size):
        holder = socket.socket()
        holder.bind((host, base + offset))
        holder.listen()
        _held.append(holder)  # held until this process exits
    with open(os.environ["LLAMARL_TEST_TAKEN_PORTS"], "a") as noted:
        noted.write(f"{os.getpid()} {size} {base}\n")
    return base


net.free_port_block = _first_block_taken
