"""The run config's learning sections: `algorithm` (the loss and its options) and `trainer`
(optimizer steps, learning-rate schedule, checkpoints, ranks). Each forbids unknown keys and
bounds its numbers; fields that conflict are refused with one line naming them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llamarl.config.base import FieldConflict, _Section, built_in_or_user

BUILT_IN_LOSSES = ("aipo", "ppo_clip", "reinforce")
BUILT_IN_ADVANTAGES = ("grpo", "rloo")


def is_user_function(name: str) -> bool:
    """Whether a loss or advantage name is the user's own `module:function`."""
    return ":" in name


class AlgorithmConfig(_Section):
    """The loss and its options (docs/learning.md, Algorithm options). pi is the trainer's
    probability of a token, mu the generator's recorded one; every ratio is pi/mu."""

    loss: str = Field("aipo", pattern=built_in_or_user(BUILT_IN_LOSSES))
    """Policy loss: aipo, ppo_clip, reinforce, or your own as `module:function` (importable where
    the trainer runs; docs/learning.md, Your own loss). aipo is truncated importance sampling
    (TIS): the policy gradient weighted by the ratio capped at rho, detached. Yours is called as
    the built-in ones are, with keywords `logp` (log pi, with gradients), `behaviour_logp`
    (log mu) and `mask` (1 on real completion tokens), each (B, L); `ratio` (pi/mu at
    `ratio_level`: (B, L), or (B, 1) per sequence); `advantages` (B, 1); and `algorithm` (this
    section). It returns what they return: the per-token loss ((B, L), logp's dtype, with
    gradients) and where its ratio was clipped ((B, L) bool). The entropy bonus, KL, masked IS
    and aggregation then apply to it as to theirs."""
    advantage: str = Field("grpo", pattern=built_in_or_user(BUILT_IN_ADVANTAGES))
    """Group baseline: grpo, rloo, or your own as `module:function`, called with the step's
    rewards ((G, n) float32: G prompt groups of n samples) and returning their advantages, as
    the built-in ones do (the same shape, floating point, finite)."""
    grpo_scale_by_std: bool = True
    """grpo divides each group's centred rewards by the group's std; false centres them only
    (Dr. GRPO). rloo never divides."""
    rho: float = Field(4.0, ge=1, le=100)
    """AIPO truncation: per-token weight min(pi/mu, rho)."""
    clip_eps: float = Field(0.2, gt=0, le=1)
    """PPO-clip epsilon: the ratio is clipped to [1 - clip_eps, 1 + clip_eps]."""
    clip_low: float | None = Field(None, gt=0, lt=1)
    """PPO-clip (or your own loss, which may read it): the lowest ratio kept, in place of
    1 - clip_eps (null: 1 - clip_eps). DAPO's decoupled range eps_low 0.2, eps_high 0.28 is
    clip_low 0.8, clip_high 1.28."""
    clip_high: float | None = Field(None, gt=1, le=100)
    """PPO-clip (or your own loss): the highest ratio kept, in place of 1 + clip_eps (null:
    1 + clip_eps)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """The ratio aipo truncates and ppo_clip clips: each token's, or its sequence's (the
    geometric mean of the sequence's token ratios, as GSPO; ppo_clip then clips whole
    sequences)."""
    mis_low: float | None = Field(None, gt=0, le=1)
    """Masked importance sampling: tokens (or sequences, `mis_level`) whose ratio is below this
    get no loss (null: no lower bound). The fraction dropped is the step's
    mis_dropped_fraction."""
    mis_high: float | None = Field(None, ge=1, le=100)
    """Masked importance sampling: tokens (or sequences) whose ratio is above this get no loss
    (null: no upper bound)."""
    mis_level: Literal["token", "sequence"] = "token"
    """What masked importance sampling drops: single tokens, or whole sequences by their
    geometric-mean ratio."""
    entropy_coef: float = Field(0.0, ge=0, le=1)
    """Entropy bonus: this times each token's policy entropy is subtracted from its loss."""
    kl_coef: float = Field(0.0, ge=0, le=10)
    """Weight of the KL penalty to the reference (initial) policy; 0: no KL and no reference
    model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimate, with r = log pi - log ref: k1 = r, k2 = r^2 / 2,
    k3 = exp(-r) + r - 1."""
    kl_in: Literal["loss", "reward"] = "loss"
    """loss: kl_coef times the per-token KL is added to the loss (gradients flow through pi).
    reward: kl_coef times each sequence's summed KL of the generator's tokens (mu against ref,
    detached) is subtracted from its reward before advantages."""
    aggregation: Literal["token_mean", "sequence_mean", "constant_sum"] = "token_mean"
    """How per-token losses are averaged: over all real tokens of the step, over sequences of
    their token means, or (Dr. GRPO) each sequence's sum divided by `loss_constant`, averaged
    over sequences."""
    loss_constant: int | None = Field(None, ge=1, le=1_000_000)
    """constant_sum's divisor in tokens (null: generation.max_new_tokens)."""

    @model_validator(mode="after")
    def _fields_agree(self) -> AlgorithmConfig:
        clip_range_set = self.clip_low is not None or self.clip_high is not None
        if self.loss in ("aipo", "reinforce") and clip_range_set:
            raise FieldConflict(
                ("clip_low", "clip_high", "loss"),
                f"the clip range is ppo_clip's, not {self.loss}'s",
            )
        if self.loss == "reinforce" and self.ratio_level != "token":
            raise FieldConflict(("ratio_level", "loss"), "reinforce uses no ratio")
        if self.mis_low is not None and self.mis_high is not None and self.mis_low >= self.mis_high:
            raise FieldConflict(("mis_low", "mis_high"), f"{self.mis_low} >= {self.mis_high} keeps no ratio")
        if self.mis_level != "token" and self.mis_low is None and self.mis_high is None:
            raise FieldConflict(
                ("mis_level", "mis_low", "mis_high"),
                "mis_level needs a band: set mis_low or mis_high",
            )
        if self.advantage != "grpo" and not self.grpo_scale_by_std:
            raise FieldConflict(("grpo_scale_by_std", "advantage"), f"{self.advantage} has no std to divide by")
        if self.kl_coef == 0 and (self.kl_estimator != "k3" or self.kl_in != "loss"):
            raise FieldConflict(("kl_estimator", "kl_in", "kl_coef"), "the KL penalty is off; set kl_coef > 0")
        if self.kl_coef > 0 and self.kl_estimator == "k1" and self.kl_in == "loss":
            raise FieldConflict(
                ("kl_estimator", "kl_in"),
                "k1's gradient is zero in expectation, so as a loss it only adds noise; use k1 "
                "with kl_in: reward, or k2/k3 in the loss",
            )
        if self.loss_constant is not None and self.aggregation != "constant_sum":
            raise FieldConflict(("loss_constant", "aggregation"), "loss_constant divides aggregation constant_sum")
        return self

    def with_loss_constant(self, max_new_tokens: int) -> AlgorithmConfig:
        """This config with constant_sum's `loss_constant` filled in as `max_new_tokens` when it
        is null."""
        if self.aggregation != "constant_sum" or self.loss_constant is not None:
            return self
        return self.model_copy(update={"loss_constant": max_new_tokens})


class TrainerConfig(_Section):
    """Optimizer steps, learning-rate schedule, checkpoints, and how the trainer's ranks hold
    the model."""

    lr: float = Field(5e-5, gt=0, le=1)
    """RL learning rate (RL wants a much smaller step than SFT); the schedule's peak."""
    lr_warmup_steps: int = Field(0, ge=0, le=10_000_000)
    """RL steps over which the lr rises linearly to `lr` (lr / lr_warmup_steps at the first)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The lr after the warm-up: constant, or a linear or cosine decay from `lr` towards
    lr_min_ratio * lr over the remaining steps of `num_steps`."""
    lr_min_ratio: float = Field(0.0, ge=0, lt=1)
    """The floor of the decay, a fraction of `lr`."""
    prompts_per_step: int = Field(16, ge=1, le=100_000)
    """Prompt groups per optimizer step."""
    num_steps: int = Field(100, ge=1, le=10_000_000)
    """RL optimizer steps in a run."""
    eval_every: int = Field(10, ge=1, le=1_000_000)
    """Evaluate held-out accuracy every this many steps."""
    evaluate_on: Literal["shared", "trainer"] = "shared"
    """Who makes an async run's evaluations between its first and its last: shared, in chunks,
    by the trainer and every generator holding the evaluated version at once
    (`llamarl.roles.held_out`; an FSDP trainer evaluates alone), or the trainer alone, between
    two steps. Before RL, after the last step and in sync runs the trainer evaluates."""
    sft_steps: int = Field(0, ge=0, le=10_000_000)
    """Supervised warm-start steps before RL on the task's reference answers (0: none). Unset,
    it is 0 for a model of your own (`model.path`) and 300 for the built character model, which
    starts knowing nothing (`BUILT_MODEL_SFT_STEPS`)."""
    sft_lr: float = Field(1e-3, gt=0, le=1)
    """Supervised warm-start learning rate."""
    sft_batch_size: int = Field(64, ge=1, le=100_000)
    """Supervised warm-start batch size."""
    checkpoint_every: int = Field(20, ge=0, le=1_000_000)
    """Checkpoint every this many steps (also after the warm start and on a stop); 0 turns
    checkpoints off, and a restarted trainer then starts over from the warm start."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept on disk."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """Gradient clipping norm."""
    micro_batch_tokens: int = Field(4096, ge=1, le=10_000_000)
    """Prompt + completion tokens per forward/backward pass; a step's groups are split into
    micro-batches of about this size (gradients accumulate), bounding activation memory."""
    ranks: int = Field(1, ge=1, le=1024)
    """Data-parallel trainer processes (`torchrun --nproc-per-node ranks`: gloo on CPU, NCCL on
    CUDA), replicas or shards (`sharding`). Each rank trains on its share of a step's groups, and
    each sends its own shard of every version to the generators. Async runs only."""
    ranks_timeout_s: float = Field(3600.0, gt=0, le=7 * 86400)
    """How long a trainer rank waits for the next step from rank 0 (which waits for rollouts,
    evaluates and checkpoints meanwhile) before it gives up."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the trainer computes; cuda: rank r uses cuda:LOCAL_RANK."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The trainer's parameter dtype (versions are sent as float32 either way)."""
    sharding: Literal["ddp", "fsdp"] = "ddp"
    """ddp: every rank holds the whole model, its gradients and optimizer state. fsdp: FSDP2
    (`fully_shard` per decoder layer, then the root) keeps 1/ranks of each on every rank, sends
    the generators each rank's own shards and checkpoints with torch.distributed.checkpoint."""
    reduce_gradients: Literal["step", "micro_batch"] = "step"
    """fsdp: when the ranks' gradients are reduced: once a step, in the last micro-batch's
    backward (the least communication), or in every micro-batch's (micro_batch), which keeps
    only each rank's shard of the gradients between micro-batches where accumulating holds them
    whole: the least memory, for a reduce-scatter a micro-batch. ddp reduces once a step."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (less memory, about a third more compute)."""
    offload: bool = False
    """fsdp on CUDA: keep parameters, gradients and optimizer state in CPU memory between uses."""

    @model_validator(mode="after")
    def _schedule_fits(self) -> TrainerConfig:
        if self.lr_warmup_steps >= self.num_steps:
            raise FieldConflict(
                ("lr_warmup_steps", "num_steps"),
                f"a warm-up of {self.lr_warmup_steps} steps never ends in {self.num_steps}",
            )
        if self.lr_schedule == "constant" and self.lr_min_ratio:
            raise FieldConflict(("lr_min_ratio", "lr_schedule"), "lr_min_ratio is the floor of a decay")
        return self

    @model_validator(mode="after")
    def _sharding_fits(self) -> TrainerConfig:
        if self.offload and (self.sharding != "fsdp" or self.device != "cuda"):
            raise FieldConflict(
                ("offload", "sharding", "device"),
                "offload moves fsdp's state between a GPU and the CPU: it needs sharding fsdp on device cuda",
            )
        if self.reduce_gradients == "micro_batch" and self.sharding != "fsdp":
            raise FieldConflict(
                ("reduce_gradients", "sharding"),
                "reducing every micro-batch keeps only shards of the gradients, with fsdp; ddp "
                "ranks hold whole gradients anyway and reduce once a step",
            )
        return self
