"""The profile's run of taking turns (`llamarl.bench.turns_probe`) is the config's own work, cut
short: its model, sampling and step shape, five steps, no warm start, one held-out prompt, no
evaluation set, a private Redis in the probe's directory (run end to end by the auto layout test,
tests/integration/test_layout.py)."""

from __future__ import annotations

from pathlib import Path

from llamarl.bench.turns_probe import TURN_STEPS, probe_config
from llamarl.config import parse_config


def test_the_probe_runs_the_configs_step_shape_briefly_in_its_own_directory(tmp_path: Path) -> None:
    config = parse_config(
        {
            "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
            "generation": {"num_samples": 6, "max_new_tokens": 9},
            "trainer": {"prompts_per_step": 3, "num_steps": 400, "sft_steps": 200, "checkpoint_every": 20},
            "redis": {"url": "redis://elsewhere:6379/0"},
            "run_dir": "runs/mine",
        }
    )
    probe = probe_config(config, tmp_path)
    assert probe.trainer.num_steps == TURN_STEPS + 2 and probe.trainer.sft_steps == 0
    assert probe.trainer.checkpoint_every == 0 and probe.task.num_eval == 1
    assert probe.redis.url is None and Path(probe.run_dir).parent == tmp_path
    assert (probe.model, probe.generation) == (config.model, config.generation)
    assert probe.trainer.prompts_per_step == 3 and probe.evaluation.sets == ()
