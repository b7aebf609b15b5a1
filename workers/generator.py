"""`llamarl worker generator`: claim prompt tickets, sample with the loaded policy version,
publish rollout groups (`llamarl.roles.generator`)."""

from __future__ import annotations

from llamarl.roles import build
from llamarl.roles.base import run_role
from workers.common import run_worker


def main(argv: list[str] | None = None) -> int:
    return run_worker("generator", argv, lambda runtime: run_role(build.generator(runtime)))


if __name__ == "__main__":
    raise SystemExit(main())
