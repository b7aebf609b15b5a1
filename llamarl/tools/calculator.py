"""The calculator tool: integer and decimal arithmetic, parsed with `ast` and evaluated node by
node, never with `eval`. Only numbers, + - * / // % **, unary minus and parentheses are allowed,
and sizes are bounded (expression length, operands and results, exponents), so no input can take
long or much memory; anything else is answered with one `error:` line."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

MAX_CHARS = 200
MAX_ABS = 10**30
MAX_EXPONENT = 64
BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    """The expression is not one the calculator takes."""


def _value(node: ast.AST) -> float:
    number = isinstance(node, ast.Constant) and type(node.value) in (int, float)
    if number and isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if abs(node.value) > MAX_ABS:
            raise CalculatorError("number out of range")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent above {MAX_EXPONENT}")
        try:
            result = BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result out of range") from None
        if isinstance(result, complex) or abs(result) > MAX_ABS:
            raise CalculatorError("result out of range")
        return result
    raise CalculatorError("only numbers, + - * / // % ** and parentheses")


def calculate(expression: str) -> str:
    """The expression's value as text (an integer when it is one); CalculatorError otherwise."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise CalculatorError("not an arithmetic expression") from None
    value = _value(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


class Calculator:
    name = "calculator"

    def call(self, argument: str) -> str:
        try:
            return calculate(argument)
        except CalculatorError as err:
            return f"error: {err}"
