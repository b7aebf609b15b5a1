"""The trainer's own record of which prompt tickets have ended.

Only the trainer ends tickets (as trained, dropped_stale or skipped), so after loading what Redis
held at its start it knows every ended ticket without asking Redis again: a late duplicate of a
ticket (a reissued lease whose first rollout arrived after all) is refused locally, with no round
trip. It keeps a floor (every ticket below it has ended) and the ended ids above it, so its
memory stays bounded by the tickets in flight; the floor is also the limit for compacting Redis.
"""

from __future__ import annotations

from collections.abc import Iterable


class TicketBook:
    def __init__(self, floor: int = 0, ended: Iterable[int] = ()) -> None:
        self.floor = floor
        self._above = {i for i in ended if i >= floor}
        self._advance()

    def has_ended(self, ticket_id: int) -> bool:
        return ticket_id < self.floor or ticket_id in self._above

    def mark(self, ticket_ids: Iterable[int]) -> None:
        self._above.update(i for i in ticket_ids if i >= self.floor)
        self._advance()

    def _advance(self) -> None:
        while self.floor in self._above:
            self._above.remove(self.floor)
            self.floor += 1
