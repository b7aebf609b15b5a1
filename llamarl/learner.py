"""One RL optimizer step on a collated batch: advantages, recomputed log-probs, loss, update.

Shared by the sync mode and the async trainer, so both learn with identical code.
"""

from __future__ import annotations

import copy

import torch

from llamarl.algorithms.advantages import group_advantages
from llamarl.algorithms.losses import policy_loss
from llamarl.config import AlgorithmConfig, TrainerConfig
from llamarl.engine.model import Policy
from llamarl.engine.sampling import token_logprobs
from llamarl.rollouts import TrainBatch


class Learner:
    def __init__(
        self,
        policy: Policy,
        algorithm: AlgorithmConfig,
        trainer: TrainerConfig,
        temperature: float,
        reference: Policy | None = None,
    ) -> None:
        self.policy = policy
        self.algorithm = algorithm
        self.trainer = trainer
        self.temperature = temperature
        self.optimizer = torch.optim.AdamW(policy.model.parameters(), lr=trainer.lr)
        if algorithm.kl_coef > 0 and reference is None:
            reference = copy.deepcopy(policy)
        self.reference = reference if algorithm.kl_coef > 0 else None

    def step(self, batch: TrainBatch) -> dict[str, float]:
        algorithm = self.algorithm
        advantages = group_advantages(batch.rewards, algorithm.advantage).flatten()
        args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        logp, entropy = token_logprobs(self.policy, *args, temperature=self.temperature)
        ref_logp = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logp, _ = token_logprobs(self.reference, *args, temperature=self.temperature)
        mask = batch.completion_mask
        out = policy_loss(
            algorithm.loss,
            logp,
            batch.behaviour_logprobs,
            advantages,
            mask,
            rho=algorithm.rho,
            clip_eps=algorithm.clip_eps,
            aggregation=algorithm.aggregation,
            ref_logp=ref_logp,
            kl_coef=algorithm.kl_coef,
        )
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.policy.model.parameters(), self.trainer.max_grad_norm
        )
        self.optimizer.step()
        num_tokens = mask.sum().clamp(min=1)
        mismatch = ((batch.behaviour_logprobs - logp.detach()) * mask).sum() / num_tokens
        return {
            "loss": float(out.loss.detach()),
            "reward_mean": float(batch.rewards.mean()),
            "entropy": float(entropy.detach().sum() / num_tokens),
            "ratio_mean": out.ratio_mean,
            "ratio_max": out.ratio_max,
            "clipped_fraction": out.clipped_fraction,
            "mismatch_kl": float(mismatch),
            "kl_ref": out.kl_ref,
            "grad_norm": float(grad_norm),
            "num_tokens": float(num_tokens),
        }
