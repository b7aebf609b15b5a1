"""Reading a deployment file's llamarl command lines with the real parsers, without starting
anything: `llamarl` itself (`workers.cli`), then the role's own worker options
(`workers.common.parse_worker_args`), so a misspelt role or option fails a test. Shared by the
compose tests and the Slurm and Kubernetes recipe tests. The broker's own parser takes the same
options but --metrics-port (and --port-file, which no deployment passes), so its options are read
with the same one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.cli import build_parser
from workers.common import parse_worker_args


@dataclass(frozen=True)
class WorkerCommand:
    role: str
    config_file: str
    worker_id: str | None


def parse_llamarl(argv: Sequence[str]) -> WorkerCommand:
    """`argv` after the `llamarl` executable: `[--log-format F] worker ROLE --config FILE ...`."""
    args = build_parser().parse_args(list(argv))
    assert args.command == "worker", f"not a worker: {list(argv)}"
    return parse_worker_options(args.role, args.rest)


def parse_worker_options(role: str, argv: Sequence[str]) -> WorkerCommand:
    """A role's options, as `llamarl worker ROLE` or `python -m workers.ROLE` reads them."""
    options = parse_worker_args(role, list(argv))
    assert options.config, f"{role}: no --config in {list(argv)}"
    return WorkerCommand(role, options.config, options.worker_id)
