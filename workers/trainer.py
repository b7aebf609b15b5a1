"""`llamarl worker trainer`: gather scored groups, enforce staleness, train, publish versions
(`llamarl.roles.trainer`); writes RUN_DIR/summary.json when it ends."""

from __future__ import annotations

import json
from pathlib import Path

from llamarl.roles import build
from llamarl.roles.runtime import RoleRuntime
from workers.common import run_worker


def train(runtime: RoleRuntime) -> None:
    trainer = build.trainer(runtime)
    try:
        summary = {"mode": "async"} | trainer.run()
        (Path(runtime.config.run_dir) / "summary.json").write_text(json.dumps(summary))
    finally:
        trainer.close()


def main(argv: list[str] | None = None) -> int:
    return run_worker("trainer", argv, train)


if __name__ == "__main__":
    raise SystemExit(main())
