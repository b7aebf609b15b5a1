"""One RL optimizer step on a list of scored prompt groups: advantages, recomputed log-probs,
loss, update at the step's learning rate (`llamarl.training.lr_schedule`).

Shared by the sync mode and the async trainer, so both learn with identical code. The forward
pass computes each group's prompt once (`llamarl.engine.grouped`) in micro-batches of at most
`trainer.micro_batch_tokens` tokens; each micro-batch's loss is its share of the whole batch's
loss, so accumulating their gradients gives exactly the one-pass gradient. AdamW runs fused
(one kernel over all parameters) where the torch build has it, else multi-tensor (foreach).

With several trainer ranks (`llamarl.training.parallel`) every rank is handed the whole step and trains
on its share of the groups, each micro-batch's loss still its share of the whole step's, scaled
by the number of ranks because DistributedDataParallel and FSDP average what they sum
(`llamarl.training.sharding`); the gradients are reduced in the last micro-batch's backward
pass (or in each one's: `trainer.reduce_gradients`), so they equal the one-process gradients up
to the order of floating-point sums. Sharded ranks repeat each prompt before its completions
rather than share it (one pass through each block).
The step's statistics are summed over ranks. Only trainable parameters get optimizer state (the
adapters, with LoRA).

With the KL to the reference in the reward (`algorithm.kl_in: reward`), a first pass computes
the reference's log-probs of the step's micro-batches (without gradients) and subtracts each
sequence's KL from its reward before the advantages; its `kl_ref` is then the KL per token.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from llamarl.algorithms.advantages import group_advantages
from llamarl.algorithms.kl import sequence_kl
from llamarl.algorithms.losses import TokenTerms, aggregate, token_terms
from llamarl.algorithms.user import check_user_functions
from llamarl.config import AlgorithmConfig, TrainerConfig
from llamarl.engine.adapters import has_adapters
from llamarl.engine.grouped import MicroBatch, TrainGroup, grouped_logprobs, micro_batches, stack
from llamarl.engine.model import Policy
from llamarl.errors import NonFiniteError
from llamarl.training.lr_schedule import set_lr
from llamarl.training.parallel import TrainerRanks
from llamarl.training.sharding import checkpoint_activations, data_parallel, local


def make_optimizer(parameters: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    params = list(parameters)
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    except RuntimeError:  # a build or device without the fused kernel
        return torch.optim.AdamW(params, lr=lr, foreach=True)


SUMMED = ("loss", "kl", "entropy", "mismatch", "mismatch_abs", "ratio_sum", "clipped", "dropped")
"""The step statistics kept as sums, added up over ranks."""


class _StepStats:
    """Sums over micro-batches of what a step reports."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.kl = 0.0
        self.entropy = 0.0
        self.mismatch = 0.0
        self.mismatch_abs = 0.0
        self.mismatch_max = 0.0
        self.ratio_sum = 0.0
        self.ratio_max: float | None = None
        self.clipped = 0.0
        self.dropped = 0.0

    def reduce(self, ranks: TrainerRanks) -> None:
        """Every rank's sums, added up (and the largest ratio of all)."""
        totals = ranks.sum([getattr(self, name) for name in SUMMED])
        for name, total in zip(SUMMED, totals, strict=True):
            setattr(self, name, total)
        top, self.mismatch_max = ranks.max([-math.inf if self.ratio_max is None else self.ratio_max, self.mismatch_max])
        self.ratio_max = None if top == -math.inf else top

    def add(
        self, batch: MicroBatch, loss: float, kl: float, logp: torch.Tensor, entropy: torch.Tensor, terms: TokenTerms
    ) -> None:
        real = batch.completion_mask.bool()
        self.loss += loss
        self.kl += kl
        self.entropy += float(entropy.detach()[real].sum())
        gap = (batch.behaviour_logprobs - logp.detach())[real]
        self.mismatch += float(gap.sum())
        if gap.numel():
            self.mismatch_abs += float(gap.abs().sum())
            self.mismatch_max = max(self.mismatch_max, float(gap.abs().max()))
        ratios = terms.ratio[real]
        if ratios.numel():
            self.ratio_sum += float(ratios.sum())
            top = float(ratios.max())
            self.ratio_max = top if self.ratio_max is None else max(self.ratio_max, top)
        self.clipped += float(terms.clipped[real].sum())
        self.dropped += float(terms.dropped[real].sum())


class Learner:
    def __init__(
        self,
        policy: Policy,
        algorithm: AlgorithmConfig,
        trainer: TrainerConfig,
        temperature: float,
        reference: Policy | None = None,
        min_new_tokens: int = 0,
        ranks: TrainerRanks | None = None,
    ) -> None:
        check_user_functions(algorithm)  # a trainer started alone checks as `llamarl run` does
        self.policy = policy
        self.ranks = ranks
        self._base_reference = algorithm.kl_coef > 0 and has_adapters(policy.model)
        """With LoRA the reference is the base: the policy with its adapters switched off."""
        if algorithm.kl_coef > 0 and reference is None and not self._base_reference:
            reference = copy.deepcopy(policy)  # a whole copy, before any sharding
        self.reference = reference if algorithm.kl_coef > 0 else None
        if trainer.activation_checkpointing:
            checkpoint_activations(policy.model)
        self._forward = policy
        """The policy the loss is computed with: wrapped or sharded with ranks."""
        self._parallel = data_parallel(trainer, ranks.device) if ranks is not None else None
        if self._parallel is not None:
            wrapped: Any = self._parallel.wrap(policy.model)
            self._forward = dataclasses.replace(policy, model=wrapped)
        self.algorithm = algorithm
        self.trainer = trainer
        self.temperature = temperature
        self.min_new_tokens = min_new_tokens
        self.optimizer = make_optimizer(self.trainable(), trainer.lr)
        self.steps_done = 0
        """RL steps taken (restored on resume): the schedule's position."""

    def resume_schedule(self, steps_done: int) -> None:
        """Continue the schedule after `steps_done` steps (the lr of a restored optimizer state
        is replaced before the next step)."""
        self.steps_done = steps_done

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.policy.model.parameters() if p.requires_grad]

    def _logprobs(self, policy: Policy, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        one_pass = self._parallel is not None and self._parallel.one_pass
        return grouped_logprobs(policy, batch, self.temperature, self.min_new_tokens, share_prompt=not one_pass)

    def step(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        algorithm = self.algorithm
        rewards = torch.stack([g.rewards for g in groups])
        device = self.policy.model.device  # where every micro-batch is computed
        num_tokens = float(sum(float(g.completion_mask.sum()) for g in groups))
        # Rows in the loss: a completion overlong shaping drops has no real tokens.
        num_rows = sum(int((g.completion_mask.sum(-1) > 0).sum()) for g in groups)
        stats = _StepStats()
        ranks = self.ranks
        mine = ranks.mine(len(groups)) if ranks is not None else list(range(len(groups)))
        scale = ranks.world if ranks is not None else 1
        cuts = micro_batches([groups[i] for i in mine], self.trainer.micro_batch_tokens)
        count = len(cuts)
        if ranks is not None and self._parallel is not None and self._parallel.lockstep:
            count = int(ranks.max([float(count)])[0])
        # A rank out of micro-batches repeats its last with no weight: sharded ranks must take
        # as many forward and backward passes as each other.
        passes = [[mine[i] for i in cuts[min(index, len(cuts) - 1)]] for index in range(count)]
        shaped = rewards
        if algorithm.kl_coef > 0 and algorithm.kl_in == "reward":
            kl = self._reward_kl(groups, passes, len(cuts), rewards.shape, stats, num_tokens)
            shaped = rewards - algorithm.kl_coef * kl
        advantages = group_advantages(shaped, algorithm.advantage, algorithm.grpo_scale_by_std)
        advantages = advantages.to(device)
        self.optimizer.zero_grad(set_to_none=True)
        for index, members in enumerate(passes):
            batch = stack([groups[i] for i in members]).to(device)
            every = self.trainer.reduce_gradients == "micro_batch"
            with self._gradient_sync(last=every or index == count - 1):
                loss, kl_share, logp, entropy, terms = self._loss(batch, advantages[members], num_tokens, num_rows)
                weight = scale if index < len(cuts) else 0
                (loss * weight).backward()
            if index < len(cuts):
                stats.add(batch, float(loss.detach()), kl_share, logp, entropy, terms)
        if ranks is not None:
            stats.reduce(ranks)
        return self._update(stats, rewards, num_tokens)

    def _reward_kl(
        self,
        groups: Sequence[TrainGroup],
        passes: list[list[int]],
        num_real: int,
        shape: torch.Size,
        stats: _StepStats,
        num_tokens: float,
    ) -> torch.Tensor:
        """(G, n): each of this rank's sequences' summed KL to the reference (zero for other
        ranks' groups, whose advantages this rank does not use); adds the KL per token to
        `stats`. Every pass is taken, as in the step: the base of sharded LoRA is sharded too."""
        kl = torch.zeros(shape)
        for index, members in enumerate(passes):
            batch = stack([groups[i] for i in members]).to(self.policy.model.device)
            ref_logp = self._reference_logprobs(batch)
            if index < num_real:
                mask = batch.completion_mask
                estimator = self.algorithm.kl_estimator
                per_sequence = sequence_kl(batch.behaviour_logprobs, ref_logp, mask, estimator)
                kl[members] = per_sequence.view(len(members), -1).float().cpu()
                stats.kl += float(per_sequence.sum()) / max(num_tokens, 1.0)
        return kl

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """With ranks, gradients are reduced in this micro-batch's backward if `last` (the
        last micro-batch's, or each one's with trainer.reduce_gradients micro_batch)."""
        if self._parallel is None:
            return contextlib.nullcontext()
        return self._parallel.gradient_sync(self._forward.model, last)

    def _reference_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """log ref of the batch's tokens, without gradients: the reference model's, or with
        LoRA the base's (the policy with its adapters switched off)."""
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(self.reference, batch)[0]
            with self.policy.model.disable_adapter():  # type: ignore[operator]
                return self._logprobs(self._forward, batch)[0]

    def _loss(
        self, batch: MicroBatch, advantages: torch.Tensor, num_tokens: float, num_rows: int
    ) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor, TokenTerms]:
        """A micro-batch's share of the step's loss, its KL share and its per-token terms
        (`batch` and `advantages` on the model's device)."""
        algorithm = self.algorithm
        logp, entropy = self._logprobs(self._forward, batch)
        kl_in_loss = algorithm.kl_coef > 0 and algorithm.kl_in == "loss"
        ref_logp = self._reference_logprobs(batch) if kl_in_loss else None
        terms = token_terms(
            algorithm, logp, batch.behaviour_logprobs, advantages.flatten(), batch.completion_mask, entropy, ref_logp
        )
        share = (batch.completion_mask, algorithm.aggregation, num_tokens, num_rows, algorithm.loss_constant)
        loss = aggregate(terms.per_token, *share)
        kl = 0.0 if terms.kl is None else float(aggregate(terms.kl.detach(), *share))
        return loss, kl, logp, entropy, terms

    def _update(self, stats: _StepStats, rewards: torch.Tensor, num_tokens: float) -> dict[str, float]:
        """Clip, step (unless something is non-finite) and report."""
        trainable = self.trainable()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, self.trainer.max_grad_norm)
        if isinstance(grad_norm, DTensor):  # sharded gradients: the norm over every rank
            grad_norm = grad_norm.full_tensor()
        # A non-finite loss or gradient would poison every weight: the update is skipped.
        finite = math.isfinite(stats.loss) and bool(torch.isfinite(grad_norm))
        lr = set_lr(self.optimizer, self.trainer, self.steps_done)
        if finite:
            self.optimizer.step()
            norms = torch._foreach_norm([local(p) for p in trainable])
            if not bool(torch.isfinite(torch.stack(norms)).all()):
                raise NonFiniteError(
                    "an optimizer step made the weights non-finite (they are neither published "
                    "nor checkpointed); lower trainer.lr or trainer.max_grad_norm"
                )
        self.steps_done += 1  # the schedule follows the RL step, also past a skipped update
        tokens = max(num_tokens, 1.0)
        return {
            "loss": stats.loss,
            "reward_mean": float(rewards.mean()),
            "entropy": stats.entropy / tokens,
            "ratio_mean": stats.ratio_sum / tokens if num_tokens else 1.0,
            "ratio_max": 1.0 if stats.ratio_max is None else stats.ratio_max,
            "clipped_fraction": stats.clipped / tokens,
            "mis_dropped_fraction": stats.dropped / tokens,
            "mismatch_kl": stats.mismatch / tokens,
            "mismatch_abs_mean": stats.mismatch_abs / tokens,
            "mismatch_abs_max": stats.mismatch_max,
            "kl_ref": stats.kl,
            "grad_norm": float(grad_norm),
            "num_tokens": num_tokens,
            "skipped_update": 0.0 if finite else 1.0,
            "lr": lr,
        }
