"""`llamarl worker reward`: score rollout groups with the task's verifier and pass them on."""

from __future__ import annotations

from llamarl.roles import build
from llamarl.roles.base import run_role
from workers.common import run_worker


def main(argv: list[str] | None = None) -> int:
    return run_worker("reward", argv, lambda runtime: run_role(build.reward(runtime)))


if __name__ == "__main__":
    raise SystemExit(main())
