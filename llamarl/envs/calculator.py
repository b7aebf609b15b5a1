"""The `calculator` and `retry` environments.

calculator: the model is asked the task's question and may call a tool (`llamarl.tools.calls`)
as often as its turns allow; each call is answered with the result, and a turn without a call
is its answer, which the reward workers score with the task's verifier.

    user       1234*5678=
    assistant  <tool>{"calculator": "1234*5678"}</tool>
    tool       <result>7006652</result>
    assistant  7006652                      -> verifier(7006652, answer)

retry: a checker (the task's verifier) judges each answer; a wrong one is answered with
`RETRY_TEXT` and the model tries again, up to environment.max_turns. A right answer at turn t
ends the episode with reward discount^(t-1); an episode that never gets it right scores 0.
Tools the config allows are answered as in calculator, and a call is not an answer.

    user       What is 47+38?
    assistant  84                            (wrong)
    user       That is not right. Try again.
    assistant  85                            -> reward discount^1
"""

from __future__ import annotations

from llamarl.envs.base import EnvContext, EnvStep, Message
from llamarl.errors import ConfigError
from llamarl.tasks import Example
from llamarl.tools.calculator import calculate
from llamarl.tools.calls import find_call, result_text, run_call, write_call

RETRY_TEXT = "That is not right. Try again."


class CalculatorEnv:
    def __init__(self, context: EnvContext) -> None:
        self.context = context

    def start(self, example: Example) -> list[Message]:
        return [{"role": "user", "content": example.prompt}]

    def tool_reply(self, reply: str) -> EnvStep | None:
        """The tool's result when the turn calls one, else None (the turn is an answer)."""
        call = find_call(reply)
        if call is None:
            return None
        return EnvStep([{"role": "tool", "content": run_call(call, self.context.tools)}], False)

    def step(self, reply: str) -> EnvStep:
        return self.tool_reply(reply) or EnvStep([], done=True)

    def demonstration(self, example: Example) -> list[Message]:
        """Call the calculator on the example's expression, then answer with the result."""
        if example.expression is None:
            raise ConfigError(
                "environment.kind calculator: a warm start needs examples with an expression "
                "(task.kind arithmetic); set trainer.sft_steps: 0 for other tasks"
            )
        return [
            {"role": "assistant", "content": write_call("calculator", example.expression)},
            {"role": "tool", "content": result_text(calculate(example.expression))},
            {"role": "assistant", "content": example.answer},
        ]


class RetryEnv(CalculatorEnv):
    def __init__(self, context: EnvContext) -> None:
        super().__init__(context)
        self.answer = ""
        self.num_answers = 0

    def start(self, example: Example) -> list[Message]:
        self.answer = example.answer
        return super().start(example)

    def step(self, reply: str) -> EnvStep:
        from_tool = self.tool_reply(reply) if self.context.tools else None
        if from_tool is not None:
            return from_tool
        self.num_answers += 1
        reward = self.context.verifier(reply, self.answer)
        if reward > 0:
            discounted = reward * self.context.discount ** (self.num_answers - 1)
            return EnvStep([], done=True, reward=discounted)
        return EnvStep([{"role": "user", "content": RETRY_TEXT}], done=False, reward=0.0)

    def demonstration(self, example: Example) -> list[Message]:
        """The right answer at once."""
        return [{"role": "assistant", "content": example.answer}]
