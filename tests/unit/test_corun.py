"""The profile's co-run probes: two forked copies, warmed once, reused for every phase, and gone
when the measurement ends."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from llamarl.bench import corun as corun_module
from llamarl.bench.corun import corun, forked


def _spin() -> None:
    sum(range(20_000))


def test_a_phase_times_only_the_probes_it_orders_each_at_least_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(corun_module, "CORUN_S", 0.05)
    with forked({"a": _spin, "b": _spin}) as probes:
        alone = probes.phase({"a": (1, None)})
        both = probes.phase({"a": (1, None), "b": (2, None)})
        pids = [probe.proc.pid for probe in probes.probes.values()]
    assert set(alone) == {"a"} and alone["a"], "one probe ordered, at least one repeat"
    assert set(both) == {"a", "b"} and all(t > 0 for t in both["a"] + both["b"])
    assert len(set(pids)) == 2, "the same two probes served both phases"
    assert not mp.active_children(), "the probes are closed on the way out"


def test_corun_reports_each_roles_slowdown_spread_and_the_oversubscribed_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(corun_module, "CORUN_S", 0.05)
    slowdown, crowded, jitter, probes_s = corun(_spin, _spin)
    assert set(jitter) == {"generate", "train"} and all(cv >= 0 for cv in jitter.values())
    assert set(probes_s["alone"]) == {"generate", "train"}
    if slowdown:  # more than one core: the side-by-side and crowded phases ran
        assert all(factor >= 1.0 for factor in slowdown.values()) and crowded >= 1.0
        assert set(probes_s["crowded"]) == {"generate", "train"}
    assert not mp.active_children()
