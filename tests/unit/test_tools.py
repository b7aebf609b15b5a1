"""The tool-call format and the calculator: what a model's call is answered with, arithmetic
evaluated without `eval` and bounded in size, and every bad call answered with one error line."""

from __future__ import annotations

import time

import pytest

from llamarl.config import EnvironmentConfig
from llamarl.envs.registry import make_tools
from llamarl.tools.calculator import Calculator
from llamarl.tools.calls import find_call, run_call, write_call

TOOLS = {"calculator": Calculator()}


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("1234*5678", "7006652"),
        ("(1+2)*3", "9"),
        ("7/2", "3.5"),
        ("-3+1", "-2"),
        ("2**10", "1024"),
        ("17//5", "3"),
        ("17%5", "2"),
    ],
)
def test_the_calculator_computes_arithmetic(expression: str, result: str) -> None:
    assert Calculator().call(expression) == result


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("open('/etc/passwd')", "only numbers"),
        ("x", "only numbers"),
        ("True+1", "only numbers"),
        ("1/0", "division by zero"),
        ("9" * 300, "longer than 200"),
        ("9" * 40, "number out of range"),
        ("2**1000", "exponent above 64"),
        ("(10**30)**64", "out of range"),
        ("1e300**2", "out of range"),
        ("1+", "not an arithmetic expression"),
    ],
)
def test_the_calculator_refuses_anything_else_with_one_line(expression: str, error: str) -> None:
    started = time.monotonic()
    answer = Calculator().call(expression)
    assert answer.startswith("error: ") and error in answer and "\n" not in answer
    assert time.monotonic() - started < 1.0


def test_a_call_is_json_in_a_tag_and_its_result_comes_back_in_one() -> None:
    turn = "let me see " + write_call("calculator", "12*34") + " then"
    body = find_call(turn)
    assert body == '{"calculator": "12*34"}'
    assert run_call(body, TOOLS) == "<result>408</result>"
    assert find_call("408") is None


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{calculator: 1}", "not JSON"),
        ('{"a": "1", "b": "2"}', "one tool"),
        ('{"search": "x"}', "no tool 'search'; tools: calculator"),
        ('{"calculator": 12}', "must be a string"),
        ("[1]", "one tool"),
    ],
)
def test_a_malformed_call_is_answered_with_an_error(body: str, error: str) -> None:
    answer = run_call(body, TOOLS)
    assert answer.startswith("<result>error: ") and error in answer


def test_an_environment_gets_the_python_tool_its_config_names() -> None:
    tools = make_tools(EnvironmentConfig(kind="retry", tools=["python", "calculator"], python_wall_s=5))
    assert sorted(tools) == ["calculator", "python"]
    assert run_call('{"python": "print(6*7)"}', tools) == "<result>42\n</result>"
    assert make_tools(EnvironmentConfig(kind="retry")) == {}
