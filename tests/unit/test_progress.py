"""What a user sees of a long phase: a bar on a terminal that ends at N/N, log lines every
interval elsewhere and one at the end; the run's progress line says what the trainer is doing."""

from __future__ import annotations

import io

from structlog.testing import capture_logs

from llamarl.observe.monitor import progress_line
from llamarl.observe.progress import Progress
from llamarl.store import MemoryStore
from tests.factories import FakeClock


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_a_log_line_every_interval_and_one_at_the_end() -> None:
    clock = FakeClock()
    with capture_logs() as logs:
        with Progress("warm start", 10, stream=io.StringIO(), interval_s=5, clock=clock) as bar:
            for _ in range(10):
                clock.advance(1)
                bar.update()
    lines = [(e["done"], e["total"]) for e in logs if e["event"] == "progress"]
    assert lines == [(5, 10), (10, 10), (10, 10)]
    assert all(e["phase"] == "warm start" for e in logs)


def test_a_listener_hears_every_update() -> None:
    heard: list[tuple[str, int, int]] = []
    with Progress("evaluation", 3, stream=io.StringIO(), listener=lambda *a: heard.append(a)) as bar:
        bar.update(2)
        bar.update()
    assert heard == [("evaluation", 2, 3), ("evaluation", 3, 3)]


def test_on_a_terminal_progress_is_a_bar_that_ends_at_n_of_n() -> None:
    terminal = Terminal()
    with capture_logs() as logs, Progress("sync steps", 4, stream=terminal) as bar:
        for _ in range(4):
            bar.update(held_out=0.5)
    assert "sync steps" in terminal.getvalue() and "4/4" in terminal.getvalue()
    assert logs == []


def test_the_progress_line_says_what_the_trainer_is_doing() -> None:
    store = MemoryStore()
    assert progress_line(store, 10).startswith("trainer not started  step 0/10")
    store.register_worker("t-1", "trainer", ttl_s=60)
    store.heartbeat("t-1", 60, status="starting")
    line = progress_line(store, 10)
    assert line.startswith("trainer starting  step 0/10") and "held-out -" in line
    store.heartbeat("t-1", 60, status="running", step=10, held_out_accuracy=0.5)
    assert progress_line(store, 10).startswith("step 10/10 ")
    assert "held-out 0.500" in progress_line(store, 10)


def test_the_progress_line_counts_skipped_tickets_once_there_are_some() -> None:
    store = MemoryStore()
    store.claim_tickets("g", 3, lease_s=60, max_staleness=1, prompts_per_step=4)
    assert "tickets issued 3 trained 0 stale 0 open 3" in progress_line(store, 10)
    store.end_tickets([(0, "trained"), (1, "skipped")])
    assert "tickets issued 3 trained 1 skipped 1 stale 0 open 1" in progress_line(store, 10)
