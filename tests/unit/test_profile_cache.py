"""The profile cache: one key per config's costs and machine, so a second `llamarl bench profile`
(or `workers.layout: auto`) reads the first's measurements instead of measuring again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamarl.bench import profile
from llamarl.config import parse_config
from llamarl.sim.costs import Costs, ThreadCosts

TREE = {
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
    "trainer": {"num_steps": 5},
}
PHASES = {"generate": 0.5, "train": 0.5}


def _costs() -> Costs:
    at = ThreadCosts(decode_s=0.01, decode_s_per_seq=0.001, train_s=0.1, train_s_per_token=0.0)
    return Costs(
        threads={1: at},
        score_s_per_group=0.0,
        stage_s=0.0,
        pull_s=0.0,
        prompt_tokens=4.0,
        corun_slowdown={},
        cores=1,
        turns_phase_s={"generate": 0.5, "train": 0.5},
    )


def test_the_key_ignores_run_length_and_follows_what_costs() -> None:
    key = profile.cache_key(parse_config(TREE))
    longer = parse_config(TREE | {"trainer": {"num_steps": 500, "eval_every": 7}, "seed": 3})
    assert profile.cache_key(longer) == key, "a longer run costs the same per step"
    wider = parse_config(TREE | {"model": TREE["model"] | {"hidden_size": 32}})
    assert profile.cache_key(wider) != key
    more = parse_config(TREE | {"generation": {"num_samples": 16}})
    assert profile.cache_key(more) != key


@pytest.mark.parametrize(
    ("cached", "accept", "measured_again"),
    [
        ({"threads": {}, "turns_phase_s": PHASES}, True, True),  # cached before the check
        ({"threads": {}, "others_cores": 1.1, "busy": True, "turns_phase_s": PHASES}, False, True),
        ({"threads": {}, "others_cores": 1.1, "busy": True, "turns_phase_s": PHASES}, True, False),
        ({"threads": {}, "others_cores": 0.1, "busy": False, "turns_phase_s": PHASES}, False, False),
        ({"threads": {}, "others_cores": 0.1, "busy": False}, False, True),  # cached before the phases
    ],
    ids=["before-the-check", "busy", "busy-accepted", "quiet", "before-the-phases"],
)
def test_a_cached_profile_not_measured_on_a_quiet_machine_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: dict, accept: bool, measured_again: bool
) -> None:
    """One measured beside other work (or that may have been) is not trusted, unless
    LLAMARL_PROFILE_BUSY=accept keeps busy ones; nor one without the turns probe's phases."""
    monkeypatch.setenv("LLAMARL_CACHE_DIR", str(tmp_path))
    if accept:
        monkeypatch.setenv("LLAMARL_PROFILE_BUSY", "accept")
    else:
        monkeypatch.delenv("LLAMARL_PROFILE_BUSY", raising=False)
    config = tmp_path / "c.json"
    config.write_text(json.dumps(TREE))
    path = profile.cached_profile(parse_config(TREE))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cached))
    calls: list[int] = []

    def measured(run_config):  # type: ignore[no-untyped-def]
        calls.append(1)
        return _costs(), {"others_cores": 0.1}

    monkeypatch.setattr(profile, "trusted_measure", measured)
    assert profile.profile(config)["cached"] is not measured_again
    assert calls == ([1] if measured_again else [])


def test_a_second_call_reads_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMARL_CACHE_DIR", str(tmp_path))
    config = tmp_path / "c.json"
    config.write_text(json.dumps(TREE))
    calls: list[int] = []

    def measured(run_config):  # type: ignore[no-untyped-def]
        """Stands in for the measurement (covered end to end by tests/integration/
        test_layout.py and test_busy_profile.py, in processes of their own): what is tested
        here is the cache."""
        calls.append(1)
        return _costs(), {"calls": len(calls), "others_cores": 0.0}

    monkeypatch.setattr(profile, "trusted_measure", measured)
    first = profile.profile(config)
    second = profile.profile(config)
    assert (first["cached"], second["cached"], len(calls)) == (False, True, 1)
    assert second["profile"] == first["profile"] and Path(first["profile"]).parent == (tmp_path / "profiles")
    assert second["costs"]["calls"] == 1, "the first measurement, read back"
    profile.profile(config, fresh=True)
    assert len(calls) == 2, "--fresh measures again"
