"""Taking turns measured for real, for `llamarl bench profile`: TURN_STEPS + 2 steps of `llamarl
run --mode sync` (the one_process layout, the program a user runs) on the config, in a process of
its own (a vLLM engine runs there as in a run), in a temporary run directory with a private Redis,
no warm start, one held-out prompt and no evaluation set. The median of the steps between the
first (first calls, allocations, the first version) and the last (its evaluation) is what
`workers.layout: auto` charges taking turns, instead of the simulator's lock-step prediction; the
medians of their generation and training calibrate the simulator's cost lines
(`llamarl.sim.calibrate`).
A median of 8: on a 2-core cloud machine the demo's steps ranged 0.33-0.46 s in one run, and the
mean of 3 came out from 0.30 to 0.42 s over 10 probes (a low one made auto take turns where a
split was 1.35x faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from llamarl.config import RunConfig
from llamarl.config.run import dump_config
from llamarl.errors import ConfigError
from llamarl.launch.supervise import llamarl_command

TURN_STEPS = 8
"""Steps timed."""
FROM_THE_ENVIRONMENT = ("LLAMARL_RUN_ID", "LLAMARL_RUN_DIR", "LLAMARL_REDIS_URL", "LLAMARL_BROKER")
"""What a run reads from its environment besides LLAMARL__SECTION__FIELD overrides: the probe's
config is resolved already, so none of it may apply twice."""


def resolved_env() -> dict[str, str]:
    """This process's environment for a process handed a resolved config: without what the
    config would read from it again (overrides, FROM_THE_ENVIRONMENT)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LLAMARL__") and key not in FROM_THE_ENVIRONMENT
    }


def probe_config(config: RunConfig, directory: Path) -> RunConfig:
    """`config` cut down to the probe's run in `directory`."""
    steps = TURN_STEPS + 2
    trainer = config.trainer.model_copy(
        update={"num_steps": steps, "sft_steps": 0, "eval_every": steps, "checkpoint_every": 0}
    )
    return config.model_copy(
        update={
            "run_id": "profile-turns",
            "run_dir": str(directory / "run"),
            "trainer": trainer,
            "task": config.task.model_copy(update={"num_eval": 1}),
            "evaluation": config.evaluation.model_copy(update={"sets": ()}),
            "redis": config.redis.model_copy(update={"url": None}),
        }
    )


def turns_s_per_step(config: RunConfig) -> tuple[float, dict[str, float]]:
    """Median seconds of the one_process layout's steps on this machine (see the module), and of
    their generation and training (`generate`, `train`)."""
    with tempfile.TemporaryDirectory(prefix="llamarl-turns-") as tmp:
        directory = Path(tmp)
        path = directory / "turns.yaml"
        path.write_text(dump_config(probe_config(config, directory)))
        done = subprocess.run(
            llamarl_command("run", str(path), "--mode", "sync"),
            capture_output=True,
            text=True,
            env=resolved_env(),
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"profile: {TURN_STEPS + 2} steps of --mode sync failed ({last})")
        records = [json.loads(line) for line in (directory / "run" / "metrics.jsonl").open()]
    timed = records[1:-1]
    phases = {phase: statistics.median(r[f"{phase}_s"] for r in timed) for phase in ("generate", "train")}
    return statistics.median(r["step_s"] for r in timed), phases
