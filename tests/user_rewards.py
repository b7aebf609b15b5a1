"""Reward functions of a user's, for the tests that run `llamarl` with them (importable as
`tests.user_rewards` from the repository root, where the commands run)."""


def says_yes(completion: str, answer: str) -> str:
    """A mistake: a string where a number belongs."""
    return "yes"
