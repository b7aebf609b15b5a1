"""Supervised warm-start: teach the model the task's answer format before RL.

Sequences are prompt + answer + EOS, right-padded; the loss covers only answer and EOS tokens.
With an environment they are its worked episodes (`demonstration()`, e.g. the calculator's call,
its result, the answer): the model's turns in the loss, the environment's replies not. An agent's
demonstrations in a model family's tool format are rendered by its chat template, tools included
(a turn's calls as the template writes them), exactly as the endpoint will record them.
SFT draws its examples from negative indices of the prompt set, a stream apart from RL's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from llamarl.config import EnvironmentConfig, RunConfig
from llamarl.engine.model import Policy, make_policy, place
from llamarl.engine.turns import TurnRenderer
from llamarl.envs.base import Message
from llamarl.envs.registry import EnvFactory
from llamarl.errors import ConfigError
from llamarl.observe.progress import Listener, Progress
from llamarl.rewards import make_verifier
from llamarl.tasks import Example, PromptSet

Demonstration = Callable[[Example], tuple[list[int], list[int]]]
"""An example's tokens and labels (-100 where there is no loss)."""


def answer_demonstration(policy: Policy) -> Demonstration:
    """Prompt, then the example's target and EOS (in the loss)."""

    def tokens(example: Example) -> tuple[list[int], list[int]]:
        prompt = policy.encode_example(example)
        answer = policy.tokenizer(example.target, add_special_tokens=False).input_ids
        answer = answer + [policy.eos_id]
        return prompt + answer, [-100] * len(prompt) + answer

    return tokens


def episode_demonstration(policy: Policy, new_env: Callable[[], Any], kind: str) -> Demonstration:
    """The worked episode of environments `new_env` makes (environment.kind `kind`): the
    model's turns (each ending in EOS) in the loss, the prompt and the environment's replies out
    of it."""
    renderer = TurnRenderer(policy)
    probe = new_env()
    if not callable(getattr(probe, "demonstration", None)):
        raise ConfigError(f"environment.kind {kind} has no demonstration() to warm-start on; set trainer.sft_steps: 0")

    def tokens(example: Example) -> tuple[list[int], list[int]]:
        env: Any = new_env()
        history: list[Message] = env.start(example)
        tools = env.tools(example) if callable(getattr(env, "tools", None)) else None
        ids = renderer.prompt(history, tools)
        labels = [-100] * len(ids)
        before_turn: list[Message] = []  # the conversation before the last model turn
        pending: list[Message] = []  # the environment's since: one reply, as at run time
        for message in env.demonstration(example):
            if message["role"] != "assistant":
                pending.append(message)
                continue
            if pending:
                reply = renderer.reply(before_turn, True, pending, tools)
                ids, labels = ids + reply, labels + [-100] * len(reply)
                history, pending = history + pending, []
            before_turn = list(history)
            try:
                text = renderer.turn_text(history, message, tools)
            except ValueError as err:  # the model's chat template, not the run, is at fault
                raise ConfigError(
                    f"environment.kind {kind}: a demonstrated turn: {err}; check model.chat_template"
                ) from None
            turn = renderer.ids(text) + [policy.eos_id]
            ids, labels = ids + turn, labels + turn
            history = history + [message]
        return ids, labels

    return tokens


def agent_demonstration(policy: Policy, environment: EnvironmentConfig) -> Demonstration:
    """The worked episodes `environment.demonstration` writes, for an agent's warm start, in
    the tool format its endpoint reads."""
    assert environment.demonstration is not None  # the launch refuses an agent's warm start without one
    from llamarl.agents.demonstrations import AgentDemonstrations
    from llamarl.agents.tool_formats import format_of

    tool_format = format_of(environment.tool_format, policy.tokenizer, policy.chat)
    demonstrations = AgentDemonstrations(environment.demonstration, tool_format)
    return episode_demonstration(policy, lambda: demonstrations, "agent")


def sft_batch(
    policy: Policy, prompt_set: PromptSet, indices: range, demonstrate: Demonstration
) -> dict[str, torch.Tensor]:
    rows, labels = [], []
    for index in indices:
        row, label = demonstrate(prompt_set.train_item(index))
        rows.append(row)
        labels.append(label)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    target = torch.full_like(ids, -100)
    for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        target[i, : len(row)] = torch.tensor(label)
    return {"input_ids": ids, "attention_mask": mask, "labels": target}


def supervised_warm_start(
    policy: Policy,
    prompt_set: PromptSet,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    demonstrate: Demonstration | None = None,
    listener: Listener | None = None,
) -> list[float]:
    """Train in place for `steps` steps on `demonstrate`'s sequences (by default the prompt and
    the example's target); returns the loss per step."""
    demonstrate = demonstrate or answer_demonstration(policy)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    losses = []
    with Progress("warm start", steps, listener=listener) as progress:
        for step in range(steps):
            first = -(step + 1) * batch_size
            batch = sft_batch(policy, prompt_set, range(first, first + batch_size), demonstrate)
            loss = policy.model(**{k: t.to(policy.model.device) for k, t in batch.items()}).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            progress.update(loss=round(losses[-1], 4))
    return losses


def starting_policy(config: RunConfig, prompt_set: PromptSet, listener: Listener | None = None) -> Policy:
    """The policy RL starts from: loaded or built, placed on the trainer's device in its dtype,
    then warm-started there when sft_steps > 0 (seeded from the config, leaving the caller's RNG
    state as it was)."""
    policy = place(make_policy(config.model, config.seed), config.trainer.device, config.trainer.dtype)
    if config.trainer.sft_steps:
        demonstrate = None
        environment = config.environment
        if environment.kind == "agent":
            demonstrate = agent_demonstration(policy, environment)
        elif environment.kind is not None:
            factory = EnvFactory(environment, make_verifier(config.task.verifier))
            demonstrate = episode_demonstration(policy, factory.new, environment.kind)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            supervised_warm_start(
                policy,
                prompt_set,
                steps=config.trainer.sft_steps,
                lr=config.trainer.sft_lr,
                batch_size=config.trainer.sft_batch_size,
                demonstrate=demonstrate,
                listener=listener,
            )
    return policy
