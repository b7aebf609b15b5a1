"""Work off the critical path: the newest-only background thread and the trainer's ticket book."""

from __future__ import annotations

import threading

import pytest

from llamarl.roles.background import LatestOnly
from llamarl.roles.ticket_book import TicketBook


def test_items_are_handled_in_order_and_a_waiting_one_gives_way_to_a_newer_one() -> None:
    started, gate = threading.Event(), threading.Event()
    handled: list[int] = []
    discarded: list[int] = []

    def handle(item: int) -> None:
        if item == 0:
            started.set()
            gate.wait(10)  # hold the thread on the first item while more arrive
        handled.append(item)

    worker = LatestOnly("test", handle, discarded.append)
    try:
        worker.submit(0)
        assert started.wait(10)
        for item in (1, 2, 3):
            worker.submit(item)
        gate.set()
        assert worker.flush(10)
        assert handled == [0, 3] and discarded == [1, 2]
        assert (worker.num_handled, worker.num_discarded) == (2, 2)
    finally:
        worker.close()


def test_an_error_on_the_thread_is_raised_to_the_owner() -> None:
    def fail(item: int) -> None:
        raise ConnectionError(f"redis gone while handling {item}")

    worker = LatestOnly("test", fail)
    try:
        worker.submit(7)
        with pytest.raises(ConnectionError, match="handling 7"):
            worker.flush(10)
        with pytest.raises(ConnectionError):
            worker.submit(8)
    finally:
        worker.close()


def test_close_handles_what_is_still_waiting() -> None:
    handled: list[int] = []
    worker = LatestOnly("test", handled.append)
    worker.submit(5)
    worker.close()
    assert handled == [5]


def test_ticket_book_keeps_a_floor_and_the_ended_ids_above_it() -> None:
    book = TicketBook(floor=3, ended=[1, 4, 6])
    assert book.floor == 3 and book.has_ended(1) and not book.has_ended(3)
    book.mark([3, 5])
    assert book.floor == 7, "3..6 have all ended"
    book.mark([9])
    assert (book.floor, book.has_ended(8), book.has_ended(9)) == (7, False, True)
