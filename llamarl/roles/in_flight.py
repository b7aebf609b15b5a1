"""A generator's claimed tickets in its running batch (continuous batching,
`llamarl.engine.continuous`, or a vLLM engine's, `llamarl.engine.vllm_batch`): each ticket's
prompt joins the batch when claimed, and its rollout
group is packed as soon as its n samples have ended."""

from __future__ import annotations

from dataclasses import dataclass

from llamarl.engine.batches import DecodingBatch
from llamarl.engine.model import Policy
from llamarl.engine.rollouts import pack_groups
from llamarl.protocol import RolloutGroup
from llamarl.store import Ticket
from llamarl.tasks import Example


@dataclass(frozen=True)
class Finished:
    ticket: Ticket
    group: RolloutGroup
    num_tokens: int
    """Tokens the model wrote for the group."""


class InFlight:
    def __init__(self, policy: Policy, batch: DecodingBatch) -> None:
        self.policy = policy
        self.batch = batch
        self.claimed: dict[int, tuple[Ticket, Example]] = {}
        """ticket id -> the ticket and its example, while its group is in the batch."""

    def __len__(self) -> int:
        """Groups being sampled."""
        return len(self.claimed)

    def admit(self, tickets: list[Ticket], examples: list[Example]) -> None:
        prompts = [(t.ticket_id, self.policy.encode_example(e)) for t, e in zip(tickets, examples, strict=True)]
        self.batch.admit(prompts)
        for ticket, example in zip(tickets, examples, strict=True):
            self.claimed[ticket.ticket_id] = (ticket, example)

    def step(self, version: int) -> list[Finished]:
        """One decode step; the groups it ended."""
        done = []
        for finished in self.batch.step(version):
            assert isinstance(finished.key, int)
            ticket, example = self.claimed.pop(finished.key)
            (group,) = pack_groups(
                self.policy, finished.batch, [example], [(ticket.ticket_id, ticket.attempt)], finished.versions
            )
            done.append(Finished(ticket, group, int(finished.batch.completion_mask.sum())))
        return done

    def restart_older_than(self, floor: int) -> tuple[int, int]:
        """Start again from its prompt every group whose oldest token's version is below
        `floor`; how many were, and how many sampled tokens that threw away."""
        stale = [
            key for key in self.claimed if (oldest := self.batch.oldest_version(key)) is not None and oldest < floor
        ]
        discarded = 0
        for key in stale:
            discarded += self.batch.drop(key)
            _, example = self.claimed[key]
            self.batch.admit([(key, self.policy.encode_example(example))])
        return len(stale), discarded
