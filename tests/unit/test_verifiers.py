"""Verifiers on answers written the way models write them, right, wrong and malformed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamarl.rewards import make_verifier

GSM8K = [
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", "72", 1.0),
    ("She earns 12 * 50 = $600.\n#### $600", "600", 1.0),
    ("The total is 1,234,567 dollars.\n#### 1,234,567", "1234567", 1.0),
    ("So the answer is 18.", "18", 1.0),
    ("The answer is: -5", "-5", 1.0),
    ("Therefore the final answer is $\\boxed{42}$.", "42", 1.0),
    ("It takes 2.5 hours.\n#### 2.5", "2.5", 1.0),
    ("#### 3.50", "3.5", 1.0),
    ("He has 5 apples left. #### 5 apples", "5", 1.0),
    ("First 3 + 4 = 7, then 7 * 2 = 14. So he needs 14 eggs.", "14", 1.0),
    ("Step 1: 10 - 3 = 7\nStep 2: 7 + 1 = 8", "8", 1.0),
    ("reference solution style", "Janet has 16 - 3 - 4 = 9 eggs.\n#### 9", 0.0),
    ("She sells 9 eggs. #### 9", "Janet has 16 - 3 - 4 = 9 eggs.\n#### 9", 1.0),
    ("The answer is 18", "19", 0.0),
    ("#### 72\nWait, actually #### 73", "73", 1.0),
    ("#### 72", "27", 0.0),
    ("I don't know.", "5", 0.0),
    ("", "5", 0.0),
    ("#### ", "5", 0.0),
    ("The answer is -5", "5", 0.0),
    ("#### 1,000", "1000.00", 1.0),
    ("The answer is $0.75.", "0.75", 1.0),
    ("####", "0", 0.0),
    ("\\boxed{}", "0", 0.0),
]

MATH = [
    ("So the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", 1.0),
    ("Thus $\\boxed{0.5}$", "\\frac12", 1.0),
    ("The final answer is $\\boxed{\\dfrac{3}{4}}$", "\\frac{3}{4}", 1.0),
    ("$\\boxed{2\\sqrt{2}}$", "\\sqrt{8}", 1.0),
    ("We get $x = \\boxed{5}$.", "5", 1.0),
    ("$\\boxed{\\pi}$", "\\pi", 1.0),
    ("The roots are $\\boxed{1, 2}$", "1,2", 1.0),
    ("$\\boxed{(1, 2)}$", "(1,2)", 1.0),
    ("$\\boxed{x^2+2x+1}$", "(x+1)^2", 1.0),
    ("$\\boxed{10\\%}$", "10\\%", 1.0),
    ("$\\boxed{-\\frac{7}{3}}$", "-\\frac{7}{3}", 1.0),
    ("The answer is $\\boxed{3}$", "3", 1.0),
    ("$\\boxed{\\frac{2}{4}}$", "\\frac{1}{2}", 1.0),
    ("$\\boxed{90^\\circ}$", "90", 1.0),
    ("So $\\boxed{3}$", "4", 0.0),
    ("$\\boxed{\\frac{1}{3}}$", "\\frac{1}{2}", 0.0),
    ("$\\boxed{x+1}$", "x-1", 0.0),
    ("I cannot solve this.", "\\frac{1}{2}", 0.0),
    ("", "5", 0.0),
    ("$\\boxed{", "5", 0.0),
    ("\\frac{{{{}", "2", 0.0),
    ("$\\boxed{\\sqrt{2}}$", "2", 0.0),
]

EXACT = [
    ("46", "46", 1.0),
    (" 46 ", "46", 1.0),
    ("047", "47", 1.0),
    ("46a", "46", 0.0),
    ("", "46", 0.0),
    ("-3", "-3", 1.0),
]
FORMAT = [
    ("#### 5", "", 1.0),
    ("the answer is 7", "", 1.0),
    ("\\boxed{3}", "", 1.0),
    ("maybe 7", "", 0.0),
]


@pytest.mark.parametrize(("completion", "answer", "reward"), GSM8K)
def test_gsm8k(completion: str, answer: str, reward: float) -> None:
    assert make_verifier("gsm8k")(completion, answer) == reward


@pytest.mark.parametrize(("completion", "answer", "reward"), MATH)
def test_math(completion: str, answer: str, reward: float) -> None:
    assert make_verifier("math")(completion, answer) == reward


@pytest.mark.parametrize(("completion", "answer", "reward"), EXACT)
def test_exact_int(completion: str, answer: str, reward: float) -> None:
    assert make_verifier("exact_int")(completion, answer) == reward


FINAL = [
    ("7+5+0=12 4+8+1=13 3+0+1=04 =0432", "432", 1.0),  # leading zeros are fine
    ("7+5+0=12 4+8+1=13 3+0+1=04 =0433", "432", 0.0),
    ("7+5+0=12 4+8+1=13 3+0+1=04 =432 ", "432", 1.0),
    ("7+5+0=12 4+8+1=13 3+0+1=04 =04a2", "432", 0.0),
    ("=0432 and more", "432", 0.0),  # something after the answer
    ("0432", "432", 0.0),  # no `=`: not the worked format
    ("", "432", 0.0),
]


@pytest.mark.parametrize(("completion", "answer", "reward"), FINAL)
def test_final_int(completion: str, answer: str, reward: float) -> None:
    assert make_verifier("final_int")(completion, answer) == reward


@pytest.mark.parametrize(("completion", "answer", "reward"), FORMAT)
def test_format(completion: str, answer: str, reward: float) -> None:
    assert make_verifier("format")(completion, answer) == reward


def test_case_counts() -> None:
    assert len(GSM8K) >= 20 and len(MATH) >= 20


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["exact_int", "final_int", "gsm8k", "format"]))
def test_odd_text_never_raises(text: str, name: str) -> None:
    assert make_verifier(name)(text, text) in (0.0, 1.0)


def test_huge_text_is_bounded() -> None:
    text = "1" * 200_000 + " #### 5"
    assert make_verifier("gsm8k")(text, "5") == 1.0
    assert make_verifier("math")("{" * 50_000, "5") == 0.0
