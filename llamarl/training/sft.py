"""Supervised warm-start: teach the model the task's answer format before RL.

Sequences are prompt + answer + EOS, right-padded; the loss covers only answer and EOS tokens.
SFT draws its examples from negative indices of the prompt set, a stream apart from RL's.
"""

from __future__ import annotations

import torch

from llamarl.config import RunConfig
from llamarl.engine.model import Policy, make_policy, place
from llamarl.observe.progress import Listener, Progress
from llamarl.tasks import PromptSet


def sft_batch(policy: Policy, prompt_set: PromptSet, indices: range) -> dict[str, torch.Tensor]:
    rows, labels = [], []
    for index in indices:
        example = prompt_set.train_item(index)
        prompt = policy.encode_prompt(example.prompt)
        answer = policy.tokenizer(example.target, add_special_tokens=False).input_ids
        answer = answer + [policy.eos_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
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
    listener: Listener | None = None,
) -> list[float]:
    """Train in place for `steps` steps; returns the loss per step."""
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    losses = []
    with Progress("warm start", steps, listener=listener) as progress:
        for step in range(steps):
            first = -(step + 1) * batch_size
            batch = sft_batch(policy, prompt_set, range(first, first + batch_size))
            loss = policy.model(**{k: t.to(policy.model.device) for k, t in batch.items()}).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            progress.update(loss=round(losses[-1], 4))
    return losses


def starting_policy(
    config: RunConfig, prompt_set: PromptSet, listener: Listener | None = None
) -> Policy:
    """The policy RL starts from: loaded or built, placed on the trainer's device in its dtype,
    then warm-started there when sft_steps > 0 (seeded from the config, leaving the caller's RNG
    state as it was)."""
    policy = place(make_policy(config.model, config.seed), config.trainer.device,
                   config.trainer.dtype)  # fmt: skip
    if config.trainer.sft_steps:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            supervised_warm_start(
                policy,
                prompt_set,
                steps=config.trainer.sft_steps,
                lr=config.trainer.sft_lr,
                batch_size=config.trainer.sft_batch_size,
                listener=listener,
            )
    return policy
