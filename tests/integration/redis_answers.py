"""Redis servers that answer a client with something other than a reply: DENIED (protected mode),
NOAUTH and WRONGPASS (a password), READONLY (a replica of a dead primary), OOM (maxmemory 1), each
a real redis-server set up to give it, and LOADING from a socket server of ours that speaks RESP
(a real Redis says LOADING only while it loads a data set, for a time no test can hold steady)."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from brokers.redis_server import RedisServer

LOADING = b"-LOADING Redis is loading the dataset in memory\r\n"
"""What a Redis loading its data set answers every command (redis-server's own words)."""


def outside_address() -> str:
    """This host's address on its route out (a UDP connect sends nothing): protected mode
    answers DENIED to a client that comes from it, not from loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), "this host has no address but loopback: protected mode cannot refuse it"
    return address


def _command_end(buffer: bytes) -> int | None:
    """Where the RESP command (an array of bulk strings) at the start of `buffer` ends; None
    until all of it has arrived."""
    head = buffer.find(b"\r\n")
    if head < 0:
        return None
    position = head + 2
    for _ in range(int(buffer[1:head])):
        size_end = buffer.find(b"\r\n", position)
        if size_end < 0:
            return None
        position = size_end + 2 + int(buffer[position + 1 : size_end]) + 2
    return position if position <= len(buffer) else None


class _Answering(socketserver.BaseRequestHandler):
    answer = LOADING

    def handle(self) -> None:
        buffer = b""
        while chunk := self.request.recv(65536):
            buffer += chunk
            while (end := _command_end(buffer)) is not None:
                self.request.sendall(self.answer)
                buffer = buffer[end:]


@contextmanager
def loading_redis(answer: bytes = LOADING) -> Iterator[str]:
    """The URL of a server that answers every command LOADING (or the error line `answer`)."""
    handler = type("Answering", (_Answering,), {"answer": answer})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="loading-redis")
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def answering_redis(answer: str, directory: Path) -> Iterator[str]:
    """The URL of a Redis that answers `answer` (DENIED, NOAUTH, WRONGPASS, READONLY, OOM,
    LOADING) to a client that uses it, for as long as the context lasts."""
    if answer == "LOADING":
        with loading_redis() as url:
            yield url
        return
    options = {
        "DENIED": ["--protected-mode", "yes"],  # and no bind: it listens on every address
        "READONLY": ["--replicaof", "127.0.0.1", "9"],  # a primary that never answers
        "OOM": ["--maxmemory", "1"],
    }.get(answer, [])
    password = "s3cret" if answer in ("NOAUTH", "WRONGPASS") else None
    bind = None if answer == "DENIED" else "127.0.0.1"
    server = RedisServer(directory, password=password, bind=bind, options=options).start()
    try:
        yield {
            "DENIED": f"redis://{outside_address()}:{server.port}/0",
            "NOAUTH": f"redis://127.0.0.1:{server.port}/0",
            "WRONGPASS": f"redis://:wrong@127.0.0.1:{server.port}/0",
        }.get(answer, server.url)
    finally:
        server.stop()
