"""ZeroMQ CURVE keys: `llamarl keys generate DIR` and applying them to sockets.

DIR holds two key pairs in ZeroMQ's certificate format (text, read with `zmq.auth`):
  server.key, server.key_secret    held by whatever binds: the broker and the trainer's
                                   weight-sync control socket
  client.key, client.key_secret    held by every worker
  authorized/client.key            public keys a server lets in (add more clients' here)
With `broker.curve_keys: DIR` every ZeroMQ socket is encrypted and authenticated: a client must
know the server's public key to complete the handshake, and a server's ZAP authenticator accepts
only clients whose public key is in DIR/authorized. Hosts that only connect need no
server.key_secret.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from llamarl.errors import ConfigError

AUTHORIZED = "authorized"


def generate_keys(directory: str | Path) -> list[Path]:
    """Write a server and a client key pair and the allow list; refuses to overwrite keys."""
    directory = Path(directory)
    existing = [p for p in ("server.key_secret", "client.key_secret") if (directory / p).exists()]
    if existing:
        raise ConfigError(f"{directory / existing[0]} exists; not overwriting keys")
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name in ("server", "client"):
        public, secret = zmq.auth.create_certificates(directory, name)
        Path(secret).chmod(0o600)
        written += [Path(public), Path(secret)]
    (directory / AUTHORIZED).mkdir(exist_ok=True)
    allowed = directory / AUTHORIZED / "client.key"
    shutil.copyfile(directory / "client.key", allowed)
    return [*written, allowed]


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise ConfigError(f"broker.curve_keys: {path} is missing (run `llamarl keys generate`)")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as err:
        raise ConfigError(f"broker.curve_keys: {path} is not a CURVE certificate: {err}") from None
    if secret and secret_key is None:
        raise ConfigError(f"broker.curve_keys: {path} holds no secret key")
    return public, secret_key


@dataclass(frozen=True)
class Curve:
    """The keys of one process, as loaded from the keys directory."""

    directory: Path
    server_public: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def load(cls, directory: str | Path) -> Curve:
        directory = Path(directory)
        server_public, _ = _load(directory / "server.key", secret=False)
        client_public, client_secret = _load(directory / "client.key_secret", secret=True)
        assert client_secret is not None
        return cls(directory, server_public, client_public, client_secret)

    def client(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.client_public
        sock.curve_secretkey = self.client_secret

    def server(self, sock: zmq.Socket) -> None:
        public, secret = _load(self.directory / "server.key_secret", secret=True)
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_server = True

    def authenticator(self, ctx: zmq.Context) -> ThreadAuthenticator:
        """Started ZAP handler for `ctx`: lets in only the public keys in DIR/authorized."""
        allowed = self.directory / AUTHORIZED
        if not allowed.is_dir():
            raise ConfigError(f"broker.curve_keys: {allowed} is missing")
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=str(allowed))
        return auth


def load_curve(directory: str | None) -> Curve | None:
    return Curve.load(directory) if directory else None
