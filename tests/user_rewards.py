"""Reward functions of a user's, for the tests that run `llamarl` with them (importable as
`tests.user_rewards` from the repository root, where the commands run)."""


def says_yes(completion: str, answer: str) -> str:
    """A mistake: a string where a number belongs."""
    return "yes"


def digit_share(completion: str) -> float:
    """The share of the completion's characters that are digits: it differs between samples,
    so every group has advantages and each step moves the model."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def huge_for_some(completion: str, answer: str) -> float:
    """A reward outside float32's range for answers ending in 0, 1 or 2 (finite as a Python float,
    so only the trainer's door sees it); elsewhere, whether the completion is right."""
    return 1e300 if answer[-1:] in "012" else float(completion.strip() == answer)


def always_huge(completion: str) -> float:
    """A reward outside float32's range for every completion."""
    return 1e300
