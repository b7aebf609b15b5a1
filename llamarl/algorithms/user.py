"""A user's own policy loss and advantage, named in the config as `algorithm.loss:
module:function` and `algorithm.advantage: module:function`, and their check before a run starts.

A loss is called exactly as the built-in ones (`llamarl.algorithms.losses`: aipo, ppo_clip,
reinforce), once per micro-batch, with these keywords (B sequences of L completion tokens, on
the trainer's device):

    logp            (B, L) float, log pi of each completion token, with gradients
    behaviour_logp  (B, L) float, log mu, recorded by the generator
    ratio           pi/mu, with gradients through logp: (B, L), or (B, 1) per sequence
                    (ratio_level sequence: the geometric mean of its token ratios)
    advantages      (B, 1) float, each sequence's advantage
    mask            (B, L) integer, 1 on real completion tokens, 0 on padding
    algorithm       the run's `AlgorithmConfig` (rho, clip_eps, clip_low, clip_high, ...)

and returns what they return, a pair `(per_token_loss, clipped)`: the loss of each token, (B, L)
in logp's dtype and computed from logp (with gradients), and where its ratio was clipped or
truncated, (B, L) bool (for the `clipped_fraction` metric). Take the keywords you need and `**_`
for the rest. Every token's loss must be finite, padding's too (it is multiplied by the mask's
0); the entropy bonus, the KL and masked importance sampling are then applied and the loss
aggregated over the mask (`algorithm.aggregation`), as for a built-in loss.

An advantage function is called as the built-in baselines (`llamarl.algorithms.advantages`)
are, once per step, with the step's rewards, (G, n) float32 (G prompt groups of n samples,
after any KL or overlong shaping), and returns their advantages: the same shape, floating point.

`check_user_functions` imports each and calls it once, on the CPU, on a tiny synthetic input
(two sequences, one with padding, ratios away from 1; two groups, one of equal rewards, as a
step often holds): what cannot be imported, is not a function, raises, or returns the wrong
shape, dtype or non-finite values (or a loss without a finite gradient) is a ConfigError naming
the field. `llamarl run`, `llamarl config check` and every trainer run it before they start.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from llamarl.algorithms.advantages import advantage_function
from llamarl.algorithms.losses import loss_function, loss_inputs
from llamarl.config import AlgorithmConfig
from llamarl.config.learning import is_user_function
from llamarl.errors import ConfigError

LOSS_BATCH = "a synthetic batch of 2 sequences of 3 tokens"
LOSS_RETURN = (
    "return (per_token_loss, clipped), both (B, L): the loss in logp's dtype, computed from "
    "logp; clipped bool (docs/learning.md, Your own loss)"
)
REWARDS = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
REWARDS_SHOWN = "rewards [[0, 1, 1, 0], [1, 1, 1, 1]] (2 groups of 4, the second all equal)"
ADVANTAGE_RETURN = "return finite advantages of the rewards' shape (G, n), floating point"


def check_user_functions(algorithm: AlgorithmConfig) -> None:
    """ConfigError naming the field unless each of the user's own functions the algorithm
    names (loss, advantage) loads and returns the right thing on a synthetic input."""
    if is_user_function(algorithm.loss):
        check_loss(algorithm)
    if is_user_function(algorithm.advantage):
        check_advantage(algorithm.advantage)


def _said(err: Exception) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(err).splitlines()
    return f"{type(err).__name__} ({lines[0]})" if lines else type(err).__name__


def _synthetic_batch() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(logp with gradients, behaviour_logp, (B,) advantages, mask): 2 sequences of 3
    tokens, the second's last padding, every ratio but one away from 1."""
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -1.5, -0.7]], requires_grad=True)
    behaviour = logp.detach() + torch.tensor([[0.1, -0.4, 0.0], [-0.2, 0.3, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp, behaviour, torch.tensor([1.0, -1.0]), mask


def check_loss(algorithm: AlgorithmConfig) -> None:
    """algorithm.loss called once on `_synthetic_batch` (ConfigError for what is wrong)."""
    spec = algorithm.loss
    function = loss_function(spec)
    logp, behaviour, advantages, mask = _synthetic_batch()
    try:
        returned = function(**loss_inputs(algorithm, logp, behaviour, advantages, mask))
        problem = loss_problem(returned, logp, mask)
    except Exception as err:  # user code failing on a batch: worth a line before anything starts
        raise ConfigError(f"algorithm.loss {spec}: raised {_said(err)} on {LOSS_BATCH}; {LOSS_RETURN}") from None
    if problem is not None:
        raise ConfigError(f"algorithm.loss {spec}: on {LOSS_BATCH} it returned {problem}; {LOSS_RETURN}")


def loss_problem(returned: Any, logp: Tensor, mask: Tensor) -> str | None:
    """What is wrong with a policy loss's return value for `logp` (None: nothing); backward
    through the loss to check its gradient."""
    if not isinstance(returned, tuple | list) or len(returned) != 2:
        return f"a {type(returned).__name__}, not a pair (per_token_loss, clipped)"
    per_token, clipped = returned
    shape = tuple(logp.shape)
    for name, value, dtype in (("a loss", per_token, logp.dtype), ("clipped", clipped, torch.bool)):
        if not isinstance(value, Tensor):
            return f"{name} that is a {type(value).__name__}, not a tensor"
        if tuple(value.shape) != shape:
            return f"{name} of shape {tuple(value.shape)}, not {shape}"
        if value.dtype != dtype:
            return f"{name} of dtype {value.dtype}, not {dtype}"
    if not bool(torch.isfinite(per_token).all()):
        return "a loss that is not finite"
    if not per_token.requires_grad:
        return "a loss without gradients"
    (gradient,) = torch.autograd.grad((per_token * mask).sum(), logp, allow_unused=True)
    if gradient is None:
        return "a loss without gradients"
    if not bool(torch.isfinite(gradient).all()):
        return "a loss whose gradient is not finite"
    return None


def check_advantage(spec: str) -> None:
    """algorithm.advantage called once on `REWARDS` (ConfigError for what is wrong)."""
    function = advantage_function(spec)
    rewards = torch.tensor(REWARDS)
    try:
        problem = advantages_problem(function(rewards.clone()), rewards)
    except Exception as err:  # user code failing on rewards: worth a line before anything starts
        raise ConfigError(
            f"algorithm.advantage {spec}: raised {_said(err)} on {REWARDS_SHOWN}; {ADVANTAGE_RETURN}"
        ) from None
    if problem is not None:
        raise ConfigError(f"algorithm.advantage {spec}: for {REWARDS_SHOWN} it returned {problem}; {ADVANTAGE_RETURN}")


def advantages_problem(returned: Any, rewards: Tensor) -> str | None:
    """What is wrong with an advantage function's return value for `rewards` (None: nothing)."""
    if not isinstance(returned, Tensor):
        return f"a {type(returned).__name__}, not a tensor"
    if returned.shape != rewards.shape:
        return f"advantages of shape {tuple(returned.shape)}, not {tuple(rewards.shape)}"
    if not returned.is_floating_point():
        return f"advantages of dtype {returned.dtype}, not floating point"
    if not bool(torch.isfinite(returned).all()):
        return "advantages that are not finite"
    return None
