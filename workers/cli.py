"""The `llamarl` command (also `python -m workers.cli`): the library's commands
(`llamarl.commands`) plus the two that start processes, `run` and `worker <role>`.

A role's module is imported only when that role is started, so `llamarl config check` and the
other light commands do not pay for torch and transformers.
"""

from __future__ import annotations

import argparse

from llamarl import commands
from llamarl.launch.allocator import keep_freed_memory

ROLES = ("broker", "generator", "reward", "trainer")


def _worker(args: argparse.Namespace) -> int:
    if args.role == "broker":
        from brokers import service

        return service.main(args.rest)
    if args.role == "generator":
        from workers import generator

        return generator.main(args.rest)
    if args.role == "reward":
        from workers import reward

        return reward.main(args.rest)
    from workers import trainer

    return trainer.main(args.rest)


def _run(args: argparse.Namespace) -> int:
    from workers import launcher

    return launcher.main(args)


def build_parser() -> argparse.ArgumentParser:
    return commands.build_parser(_run, _worker, ROLES)


def main(argv: list[str] | None = None) -> int:
    keep_freed_memory()  # before any tensor is allocated (llamarl/launch/allocator.py)
    return commands.main(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
