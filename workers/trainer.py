"""`llamarl worker trainer`: gather scored groups, enforce staleness, train, publish versions
(`llamarl.roles.trainer`); writes RUN_DIR/summary.json and the final model when it ends."""

from __future__ import annotations

from llamarl.roles import build
from llamarl.roles.runtime import RoleRuntime
from workers.common import run_worker


def train(runtime: RoleRuntime) -> None:
    trainer = build.trainer(runtime)
    try:
        trainer.run("async")
    finally:
        trainer.close()


def main(argv: list[str] | None = None) -> int:
    return run_worker("trainer", argv, train)


if __name__ == "__main__":
    raise SystemExit(main())
