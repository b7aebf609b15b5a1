"""What a well-formed request may still not ask of the model: more choices than
`generation.openai.max_choices`, token ids outside the vocabulary, or (counted, not refused)
sampling settings other than the run's, which every training turn is sampled at."""

from __future__ import annotations

from dataclasses import dataclass

from llamarl.agents.wire import CompletionRequest, Request
from llamarl.engine.episodes import Sampling
from llamarl.engine.model import Policy

UNBOUNDED_POSITIONS = 1 << 30


def positions(policy: Policy) -> int:
    """The longest context the policy's model takes (its config's position embeddings)."""
    return int(getattr(policy.model.config, "max_position_embeddings", UNBOUNDED_POSITIONS))


@dataclass(frozen=True)
class RequestLimits:
    max_choices: int
    vocab_size: int
    positions: int
    """The longest context plus turn the model takes."""

    def problem(self, body: Request) -> str | None:
        """What is wrong with `body` for this model, in one line; None when nothing is."""
        if body.n > self.max_choices:
            return f"n: at most {self.max_choices} (generation.openai.max_choices)"
        if isinstance(body, CompletionRequest) and isinstance(body.prompt, list):
            if not all(0 <= token < self.vocab_size for token in body.prompt):
                return f"prompt: token ids are below {self.vocab_size}"
        return None

    def overrides(self, body: Request, sampling: Sampling) -> bool:
        """Whether `body` asks for a temperature or top-p other than the run's."""
        asked = (body.temperature, body.top_p)
        return asked[0] not in (None, sampling.temperature) or asked[1] not in (
            None,
            sampling.top_p,
        )
