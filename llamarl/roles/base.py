"""The one interface of the roles (generator, reward scorer, trainer, and a trainer's other ranks):
`start()`, `run()` to completion, `close()`; `run` returns a typed `RoleResult`. A worker process
drives any of them with `run_role`; the synchronous baseline drives the same components step by
step instead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RoleResult:
    """What a role's run ended with."""

    role: str
    worker_id: str
    units: int
    """The role's own unit of work done: groups generated, groups scored, optimizer steps."""
    summary: dict[str, Any] = field(default_factory=dict)
    """The trainer's run summary (also RUN_DIR/summary.json); empty for the other roles."""


class Role(Protocol):
    def start(self) -> None:
        """Get ready to run (the trainer resumes or warm-starts and publishes its first
        version); the others have nothing to do before their loop."""
        ...

    def run(self) -> RoleResult:
        """Loop until the run is done or a stop is asked for."""
        ...

    def close(self) -> None:
        """Release what the role holds (weight transports, threads, files), also after a
        failed run. The runtime and its store and bus belong to the caller."""
        ...


def run_role(role: Role) -> RoleResult:
    """Start, run to completion, and always close."""
    try:
        role.start()
        return role.run()
    finally:
        role.close()
