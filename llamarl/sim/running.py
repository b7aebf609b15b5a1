"""A continuous-batching generator's running batch in the simulator, as `llamarl.roles.in_flight`
keeps it: its rows decode one position a step and leave when their completion ends; a group is
done when all its rows have; a group's place (its n rows) is free once as many rows have ended,
in whichever groups; taking up a new version restarts every group whose oldest token falls more
than the staleness bound behind it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunningGroup:
    ticket: int
    version: int
    """The version of its oldest token (the one it was admitted or last restarted at)."""
    lengths: list[int]
    """Its completions' lengths in tokens."""
    decoded: int = 0
    """Positions decoded so far."""

    @property
    def rows(self) -> int:
        return sum(1 for length in self.lengths if length > self.decoded)


@dataclass
class RunningBatch:
    num_samples: int
    groups: list[RunningGroup] = field(default_factory=list)

    def rows(self) -> int:
        return sum(group.rows for group in self.groups)

    def free_groups(self, capacity: int) -> int:
        """How many more groups fit in `capacity` groups' rows."""
        return max(0, capacity - -(-self.rows() // self.num_samples))

    def admit(self, ticket: int, version: int, lengths: list[int]) -> None:
        self.groups.append(RunningGroup(ticket, version, lengths))

    def step(self) -> list[RunningGroup]:
        """Decode one position of every running row; the groups that it ended, removed."""
        for group in self.groups:
            group.decoded += 1
        ended = [group for group in self.groups if not group.rows]
        self.groups = [group for group in self.groups if group.rows]
        return ended

    def restart_older_than(self, floor: int, version: int) -> int:
        """Start again, at `version`, every group whose oldest token is below `floor`; how
        many were."""
        stale = [group for group in self.groups if group.version < floor]
        for group in stale:
            group.version, group.decoded = version, 0
        return len(stale)
