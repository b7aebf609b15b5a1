"""The calculator task written as an OpenEnv environment, with OpenEnv's own API (an
`Environment` with `reset` and `step`, pydantic `Action` and `Observation`), and trained by
llamarl through its OpenEnv adapter: `configs/episodes/openenv_calculator.yaml`.

The model may call the calculator as `<tool>{"calculator": "1234*5678"}</tool>`, and reads its
result as `<result>7006652</result>`; a reply without a call is its answer, rewarded 1 when it is
the product.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from examples.calculator_agent import calculate
from llamarl.agents.openenv import openenv_agent

CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)


class CalculatorAction(Action):
    text: str


class CalculatorObservation(Observation):
    text: str = ""


class CalculatorEnvironment(Environment):
    def __init__(self) -> None:
        super().__init__()
        self.answer = ""
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **row: Any) -> CalculatorObservation:
        self.answer = str(row["answer"])
        self._state = State(episode_id=episode_id, step_count=0)
        return CalculatorObservation(text=str(row["prompt"]))

    def step(self, action: CalculatorAction, timeout_s: float | None = None, **_: Any) -> CalculatorObservation:
        self._state.step_count += 1
        call = CALL.search(action.text)
        if call is None:
            right = action.text.strip() == self.answer
            return CalculatorObservation(done=True, reward=float(right))
        try:
            expression = str(json.loads(call.group(1))["calculator"])
        except (ValueError, KeyError, TypeError):
            return CalculatorObservation(text="<result>error: bad call</result>")
        return CalculatorObservation(text=f"<result>{calculate(expression)}</result>")

    @property
    def state(self) -> State:
        return self._state


agent = openenv_agent(CalculatorEnvironment, lambda text: CalculatorAction(text=text), max_turns=3)
