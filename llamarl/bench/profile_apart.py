"""A profile's measurement in a process of its own (`measure_apart`): `llamarl bench profile
--fresh` of the resolved config, in a cache of its own, keeping what it measures whatever the
load (LLAMARL_PROFILE_BUSY=accept: the caller judges the load itself).

`llamarl.bench.profile` measures its first attempt in its own process and a second one (the
first was measured on a busy machine) here: the first ran torch on every core, and a co-run probe
forked from such a process can deadlock in the OpenMP runtime it inherits (seen: a probe stuck in
MKL's VML threader inside libgomp until the probes' REPLY_S).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from llamarl.bench.turns_probe import resolved_env
from llamarl.config import RunConfig
from llamarl.config.run import dump_config
from llamarl.errors import ConfigError
from llamarl.launch.supervise import llamarl_command
from llamarl.sim.costs import Costs

MEASURED = ("model_bytes", "load_s", "points", "probes_s")
"""What a profile keeps beside its costs that a measurement makes."""


def measure_apart(config: RunConfig) -> tuple[Costs, dict[str, Any]]:
    """`llamarl.bench.profile.measure` of `config` in a process of its own: its costs, and what
    else it measured."""
    with tempfile.TemporaryDirectory(prefix="llamarl-profile-") as tmp:
        path, out = Path(tmp) / "config.yaml", Path(tmp) / "measured.json"
        path.write_text(dump_config(config))
        env = resolved_env() | {"LLAMARL_CACHE_DIR": str(Path(tmp) / "cache"), "LLAMARL_PROFILE_BUSY": "accept"}
        done = subprocess.run(
            llamarl_command("bench", "profile", str(path), "--fresh", "--out", str(out)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"profile: measuring in a process of its own failed ({last})")
        tree = json.loads(out.read_text())
        return Costs.load(out), {key: tree[key] for key in MEASURED if key in tree}
