"""The profile's co-run generator for a vLLM config (`llamarl.bench.engine_probe`): a vLLM engine
in a process of its own, every one of its threads moved to the core it is ordered to, repeating a
generator's batch for the co-run's time on go; and the profile's co-run measured with it beside a
forked trainer, on a small model saved as a Hugging Face directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llamarl.bench.corun import CORUN_S, corun
from llamarl.bench.engine_probe import EngineProbe
from llamarl.bench.profile import Probes
from llamarl.config import parse_config

VLLM = {"engine": "vllm", "vllm": {"dtype": "float32", "kv_cache_gb": 0.25}}


def _config(model_dir: Path) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "generation": {"num_samples": 2, "max_new_tokens": 8, "prompts_per_batch": 2, **VLLM},
        "trainer": {"prompts_per_step": 2},
    }


def _cores_of(pid: int) -> set[frozenset[int]]:
    """The cores each thread of `pid` may run on."""
    return {frozenset(os.sched_getaffinity(int(task.name))) for task in Path(f"/proc/{pid}/task").iterdir()}


def test_every_thread_of_the_engine_goes_where_it_is_ordered_and_repeats_its_batch(small_model_dir: Path) -> None:
    core = sorted(os.sched_getaffinity(0))[-1]
    probe = EngineProbe(parse_config(_config(small_model_dir)))
    try:
        assert probe.reply() == b"ready", "warm: its engine started and sampled a batch"
        probe.order(1, core)
        assert probe.reply() == b"ready"
        assert _cores_of(probe.proc.pid) == {frozenset({core})}, "every thread, the engine's too, on the core"
        probe.start()
        times = json.loads(probe.reply())
        assert times and all(t > 0 for t in times) and sum(times) >= 0.9 * CORUN_S
        probe.order(1, None)
        assert probe.reply() == b"ready"
        assert _cores_of(probe.proc.pid) == {frozenset(os.sched_getaffinity(0))}, "back on every core"
    finally:
        probe.close()
    assert probe.proc.returncode == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a co-run needs two cores")
def test_the_profiles_corun_measures_a_trainer_beside_a_vllm_generator(small_model_dir: Path) -> None:
    config = parse_config(_config(small_model_dir))
    probes = Probes(config)
    assert probes.engine is not None
    engine = EngineProbe(config)
    try:
        slowdown, crowded, jitter, seconds = corun(engine, probes.train_unit)
    finally:
        engine.close()
    assert set(slowdown) == {"generate", "train"} and min(slowdown.values()) >= 1.0
    assert crowded >= 1.0 and set(jitter) == {"generate", "train"}
    assert seconds["alone"]["generate"] > 0 and seconds["side_by_side"]["generate"] > 0
