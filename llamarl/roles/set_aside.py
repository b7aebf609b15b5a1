"""The groups the trainer sets aside instead of training them, and their tickets, ended `skipped`
at the end of a gather in one round trip (a skipped ticket gives its slot back: the gate draws a
new prompt in its place).

A group is set aside when dynamic sampling skips it, when an environment (or an agent) raised in
one of its episodes, or when the trainer's door refused it for its reward (past float32's range):
the same scorer would give that reward again, so a ticket left open for a redo would be refused
forever. The last two are failures: once `in_a_row` groups in a row failed the same way, the run
ends with a ConfigError naming what to fix.
"""

from __future__ import annotations

from llamarl.engine.rollouts import episode_records
from llamarl.errors import ConfigError, ProtocolError
from llamarl.protocol import ScoredGroup
from llamarl.roles.runtime import RoleRuntime

RAISED = ("env_error", "agent_error")
"""The ends of an episode whose environment or agent raised: its group is set aside."""


class SetAside:
    def __init__(self, runtime: RoleRuntime, in_a_row: int) -> None:
        self.runtime = runtime
        self.in_a_row = in_a_row
        self.tickets: list[int] = []
        """Tickets set aside since the last gather, to end in one round trip."""
        self.num_set_aside = 0
        """Groups set aside so far, for every reason."""
        self.env_failures_in_a_row = 0
        self.bad_rewards_in_a_row = 0

    def add(self, ticket_id: int) -> None:
        self.tickets.append(ticket_id)
        self.num_set_aside += 1

    def env_failed(self, scored: ScoredGroup) -> bool:
        """Whether an environment (or an agent) raised in one of the group's episodes (counted);
        ConfigError, naming it, once one did in `in_a_row` groups in a row."""
        errors = [r["error"] for r in episode_records(scored.group) if r["end"] in RAISED]
        self.env_failures_in_a_row = self.env_failures_in_a_row + 1 if errors else 0
        if self.env_failures_in_a_row >= self.in_a_row:
            environment = self.runtime.config.environment
            named = f"agent {environment.agent}" if environment.agent else f"kind {environment.kind}"
            raise ConfigError(
                f"environment.{named}: it raised in "
                f"{self.in_a_row} episode groups in a row (the last: {errors[0]}); fix it "
                "and resume, or set another environment"
            )
        if errors:
            self.runtime.count("groups_env_error")
        return bool(errors)

    def passed(self) -> None:
        """A group passed the trainer's door."""
        self.bad_rewards_in_a_row = 0

    def bad_reward(self, err: ProtocolError) -> None:
        """The door refused a group for its reward (counted; the caller sets it aside);
        ConfigError once it did `in_a_row` times in a row."""
        self.bad_rewards_in_a_row += 1
        if self.bad_rewards_in_a_row >= self.in_a_row:
            raise ConfigError(
                f"the rewards of {self.in_a_row} groups in a row were past float32's range (the last: "
                f"{err}); fix what scores them (task.reward, the environment or the agent) and resume"
            )
        self.runtime.count("groups_bad_reward")

    def end(self) -> None:
        """End the tickets set aside since the last call, `skipped`."""
        if not self.tickets:
            return
        self.runtime.store.end_tickets([(i, "skipped") for i in self.tickets])
        self.runtime.count("groups_skipped", len(self.tickets))
        self.tickets = []
