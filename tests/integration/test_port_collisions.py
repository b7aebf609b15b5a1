"""Ports a run chooses itself cannot be lost to a race: with the first block every process of
the run picks taken by someone else (tests/integration/first_ports_taken), a run starts, is
stopped, resumes and completes with nothing lost. A port the user set is kept, and a taken one
is a config error (tests/integration/test_bad_input.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.integration.async_helpers import (
    check_resumed_run,
    launch,
    wait_for_steps,
    write_config,
)

HOOK = Path(__file__).parent / "first_ports_taken"


def test_a_run_whose_first_ports_are_taken_starts_resumes_and_completes(tmp_path: Path) -> None:
    taken = tmp_path / "taken.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
        "LLAMARL_TEST_TAKEN_PORTS": str(taken),
    }
    steps = 16
    config = write_config(
        tmp_path,
        "ports",
        trainer={"num_steps": steps, "checkpoint_every": 4},
        staleness={"max_staleness": 1, "lease_s": 2.0},
    )
    run_dir = tmp_path / "ports"
    proc = launch(config, env=env)
    wait_for_steps(run_dir, 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]

    proc = launch(config, "--resume", env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    check_resumed_run(out, run_dir, steps)
    # Each start lost its first Redis port (the launcher's choice) and its first broker block
    # (the broker's own), and went on.
    sizes = sorted(int(line.split()[1]) for line in taken.read_text().splitlines())
    assert sizes == [1, 1, 4, 4], taken.read_text()
