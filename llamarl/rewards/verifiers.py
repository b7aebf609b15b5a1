"""Verifiers: exact integer, final integer after worked steps, GSM8K-style final answers, MATH-style answers, format.

Each verifier maps (completion, reference answer) to a float and never raises: `make_verifier`
wraps it so odd text scores 0.0. Text is cut to MAX_CHARS before any regex, and MATH answers go
through Hugging Face's math-verify with its parsing and verification timeouts, so a slow case is
bounded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

import structlog

from llamarl.protocol import trainable_reward

log = structlog.get_logger(__name__)
MAX_CHARS = 8000
MATH_TIMEOUT_S = 3
Verifier = Callable[[str, str], float]

_NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?|-?\$?\s*\.\d+"
_ANCHORS = [
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"answer\s+is\s*:?\s*(" + _NUMBER + ")", re.IGNORECASE),
]
_ANY_NUMBER = re.compile(_NUMBER)


def _to_decimal(text: str) -> Decimal | None:
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def extract_final_number(text: str, fallback_last_number: bool = True) -> Decimal | None:
    """The final answer as GSM8K solutions write it: `#### N`, `\\boxed{N}`, `the answer is N`;
    else (optionally) the last number in the text."""
    text = text[-MAX_CHARS:]
    for pattern in _ANCHORS:
        found = pattern.findall(text)
        if found:
            return _to_decimal(found[-1])
    if fallback_last_number:
        numbers = _ANY_NUMBER.findall(text)
        if numbers:
            return _to_decimal(numbers[-1])
    return None


def exact_int(completion: str, answer: str) -> float:
    """1.0 when the completion, stripped, is exactly the integer answer."""
    text = completion.strip()[:MAX_CHARS]
    if not re.fullmatch(r"-?\d+", text):
        return 0.0
    return float(int(text) == int(answer.strip()))


def final_int(completion: str, answer: str) -> float:
    """1.0 when the text after the completion's last `=` is exactly the integer answer (leading
    zeros allowed): the worked-arithmetic format, whose working comes before that `=`."""
    _, equals, last = completion.strip()[-MAX_CHARS:].rpartition("=")
    if not equals or not re.fullmatch(r"-?\d+", last.strip()):
        return 0.0
    return float(int(last) == int(answer.strip()))


def gsm8k(completion: str, answer: str, fallback_last_number: bool = True) -> float:
    """1.0 when the completion's final number equals the reference's (which may itself be a
    full GSM8K solution ending in `#### N`)."""
    got = extract_final_number(completion, fallback_last_number)
    want = extract_final_number(answer, True)
    return float(got is not None and want is not None and got == want)


def math_answer(completion: str, answer: str) -> float:
    """MATH-style equivalence through math-verify (boxed answers, LaTeX, fractions, sets)."""
    from math_verify import parse, verify

    gold_text = answer if ("$" in answer or "\\boxed" in answer) else f"${answer}$"
    gold = parse(gold_text, parsing_timeout=MATH_TIMEOUT_S)
    guess = parse(completion[-MAX_CHARS:], parsing_timeout=MATH_TIMEOUT_S)
    if not gold or not guess:
        return 0.0
    return float(verify(gold, guess, timeout_seconds=MATH_TIMEOUT_S))


def format_ok(completion: str, answer: str) -> float:
    """1.0 when the completion states a final answer in a recognised form (####, boxed, 'the
    answer is'); the answer's value is not checked."""
    text = completion[-MAX_CHARS:]
    return float(any(pattern.search(text) for pattern in _ANCHORS))


VERIFIERS: dict[str, Verifier] = {
    "exact_int": exact_int,
    "final_int": final_int,
    "gsm8k": gsm8k,
    "math": math_answer,
    "format": format_ok,
}


def make_verifier(name: str) -> Verifier:
    """The named verifier, wrapped so that any failure on odd text scores 0.0 (logged)."""
    return guarded(name, VERIFIERS[name])


def guarded(name: str, inner: Verifier) -> Verifier:
    """`inner` made safe: an exception, or a result that is not a finite number, scores 0.0
    (logged)."""

    def safe(completion: str, answer: str) -> float:
        try:
            reward = float(inner(completion, answer))
            if not trainable_reward(reward):
                raise ValueError(f"reward {reward}")
            return reward
        except Exception as err:  # a verifier must never take its worker down
            log.warning("verifier failed", verifier=name, error=type(err).__name__)
            return 0.0

    return safe
