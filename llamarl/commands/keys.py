"""`llamarl keys generate DIR`: ZeroMQ CURVE key pairs for the broker and its clients."""

from __future__ import annotations

import argparse
import sys

from llamarl.commands.base import Subparsers


def register(sub: Subparsers) -> None:
    keys = sub.add_parser("keys", help="ZeroMQ CURVE keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser("generate", help="write server and client key pairs to DIR")
    generate.add_argument("directory")
    generate.set_defaults(func=_keys_generate)


def _keys_generate(args: argparse.Namespace) -> int:
    from llamarl.curve import generate_keys

    for path in generate_keys(args.directory):
        print(path)
    print(
        f"set broker.curve_keys: {args.directory} (every host needs client.key_secret and "
        "server.key; hosts that bind also server.key_secret)",
        file=sys.stderr,
    )
    return 0
