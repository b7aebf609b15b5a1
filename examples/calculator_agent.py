"""The calculator task as an agent anyone would write against the OpenAI API: a chat loop with
one tool, and nothing of llamarl's. `configs/episodes/calculator_agent.yaml` trains it; it learns
as the built-in calculator environment does (docs/environments.md).

    user       1234*5678=
    assistant  tool_calls: calculator(expression="1234*5678")
    tool       7006652
    assistant  7006652                      -> the run's verifier scores it (we return None)
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

MAX_TURNS = 3
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression of integers.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """The value of an expression of integers with + - *, or an error line."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only integers and + - *")

    try:
        return str(value(ast.parse(expression[:100], mode="eval").body))
    except (SyntaxError, ValueError) as err:
        return f"error: {err}"


async def agent(row: dict[str, Any], client: Any) -> float | None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None  # an answer: the reward workers score it
        for call in message.tool_calls:
            expression = json.loads(call.function.arguments).get("expression", "")
            result = calculate(expression)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def demonstration(row: dict[str, Any]) -> dict[str, Any]:
    """A worked episode for the warm start, with the tool offered (as in OpenAI's fine-tuning
    files): call the calculator, then answer with its result."""
    expression = row["prompt"].rstrip("=")
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
    }
    messages = [
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": calculate(expression)},
        {"role": "assistant", "content": row["answer"]},
    ]
    return {"messages": messages, "tools": [CALCULATOR]}
