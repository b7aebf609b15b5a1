"""The RL learning-rate schedule: a linear warm-up, then constant or a linear or cosine decay
to a floor over `trainer.num_steps`.

The lr is a pure function of the number of RL steps done (`lr_factor`), set on the optimizer
before each step (`set_lr`), so a trainer resumed at step k uses the same lr as one that ran k
steps, whatever the optimizer state it restored says.
"""

from __future__ import annotations

import math

import torch

from llamarl.config import TrainerConfig


def lr_factor(trainer: TrainerConfig, steps_done: int) -> float:
    """The multiple of `trainer.lr` used by the step taken after `steps_done` steps."""
    warmup = trainer.lr_warmup_steps
    if steps_done < warmup:
        return (steps_done + 1) / warmup
    if trainer.lr_schedule == "constant":
        return 1.0
    progress = min((steps_done - warmup) / (trainer.num_steps - warmup), 1.0)
    remaining = 1.0 - progress
    if trainer.lr_schedule == "cosine":
        remaining = 0.5 * (1.0 + math.cos(math.pi * progress))
    floor = trainer.lr_min_ratio
    return floor + (1.0 - floor) * remaining


def set_lr(optimizer: torch.optim.Optimizer, trainer: TrainerConfig, steps_done: int) -> float:
    """Give every parameter group the lr of the step after `steps_done`; that lr."""
    lr = trainer.lr * lr_factor(trainer, steps_done)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
