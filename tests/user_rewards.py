"""Reward functions of a user's, for the tests that run `llamarl` with them (importable as
`tests.user_rewards` from the repository root, where the commands run)."""


def says_yes(completion: str, answer: str) -> str:
    """A mistake: a string where a number belongs."""
    return "yes"


def digit_share(completion: str) -> float:
    """The share of the completion's characters that are digits: it differs between samples,
    so every group has advantages and each step moves the model."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)
