"""Rule verifiers that turn a completion and a reference answer into a float reward."""

from llamarl.rewards.verifiers import VERIFIERS, make_verifier

__all__ = ["VERIFIERS", "make_verifier"]
