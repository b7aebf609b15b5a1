"""The one_process layout (`workers.layout: one_process`, `llamarl run --mode sync`): every role in
the launcher's process, taking turns, with the run kept as an async run keeps it (a Redis ledger,
checkpoints), takes the steps of the lock-step loop on an in-memory store, weight for weight.
Auto's choice of it, SIGKILLed and resumed: tests/integration/test_layout.py."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from llamarl.config import parse_config
from llamarl.launch.sync_run import run_sync
from tests.integration.async_helpers import check_resumed_run, metrics_records, wait_for_steps
from tests.integration.commands import LLAMARL


def test_one_process_stopped_and_resumed_takes_the_steps_of_the_in_memory_lock_step_loop(tmp_path: Path) -> None:
    """`llamarl run --mode sync` (Redis ledger, checkpoints), Ctrl-C'd mid-run and resumed, against
    the lock-step loop on an in-memory store run through: same seed, same prompts and samples (the
    stop's checkpoint holds the RNG states), the same weights at the end."""
    steps = 12
    tree = {
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "generation": {"num_samples": 2, "max_new_tokens": 4},
        "trainer": {
            "prompts_per_step": 4,
            "num_steps": steps,
            "eval_every": 3,
            "sft_steps": 0,
            "checkpoint_every": 5,
            "lr": 1e-3,  # each step moves a weight by about lr: other samples would show
        },
        "task": {"num_eval": 8},
        "workers": {"num_cores": 1},
    }
    run_dir = tmp_path / "durable"
    config = tmp_path / "durable.yaml"
    config.write_text(yaml.safe_dump(tree | {"run_id": "durable", "run_dir": str(run_dir)}))
    command = [*LLAMARL, "run", str(config), "--mode", "sync"]
    with open(tmp_path / "err.txt", "w") as err:  # a pipe no one reads would fill and block it
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    wait_for_steps(run_dir, 3, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130, (tmp_path / "err.txt").read_text()[-3000:]
    assert f"llamarl run {config} --resume" in (tmp_path / "err.txt").read_text()
    assert len(metrics_records(run_dir)) < steps, "stopped mid-run"

    done = subprocess.run([*command, "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = check_resumed_run(done.stdout, run_dir, steps)
    assert summary["ledger"]["reopened"] == 0, "the stop's checkpoint loses no step"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the durable run's workers.num_cores
    try:
        run_sync(parse_config(tree | {"run_id": "memory", "run_dir": str(tmp_path / "memory")}))
    finally:
        torch.set_num_threads(threads)
    on_disk = load_file(run_dir / "model" / "model.safetensors")
    in_memory = load_file(tmp_path / "memory" / "model" / "model.safetensors")
    assert on_disk.keys() == in_memory.keys()
    for name, tensor in on_disk.items():
        assert torch.allclose(tensor, in_memory[name], rtol=0, atol=1e-6), name
    assert not (tmp_path / "memory" / "checkpoints").exists(), "an in-memory run has nothing to resume"
