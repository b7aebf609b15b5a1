"""Each trainer rank's peak memory, estimated from the config before anything starts (the check
that uses it is `llamarl.training.memory_check`).

The model is counted, not built: it is constructed on the `meta` device (the built tiny Llama,
or `config.json` of `model.path`), which gives P, its parameters (tied ones once), the largest
decoder block B, the parameters outside the blocks R (embeddings, output layer, final norm),
the LoRA adapters A (r x (in + out) per target layer) and the widths H (hidden), I (MLP), V
(vocabulary). T is what trains: P, or A with LoRA. b is trainer.dtype's bytes (4 or 2), N the
ranks. One rank's peak on the host (trainer.device cpu) is the largest of three phases:

- construction: the process baseline (python, torch, transformers, a gloo group:
  `BASELINE_BYTES`, measured) plus the model as it is built or loaded, in float32 (P x 4; plus
  P x b while it is cast to bfloat16).
- warm start (rank 0 with trainer.sft_steps > 0): baseline, weights, gradients and AdamW
  moments of the whole model and AdamW's foreach temporaries (5 x P x b), and the activations
  of an SFT batch.
- training: baseline; weights (P x b, fsdp: / N); with algorithm.kl_coef > 0 and no LoRA the
  reference copy (P x b, whole on every rank); gradients (T x b, fsdp: / N); AdamW's two moments
  (2 x T x b, fsdp: / N); activations; with ddp ranks DistributedDataParallel's gradient buckets
  (another T x b); with fsdp what is gathered (`ROOT_COPIES` x R x b: the root's weights, held
  whole through forward and backward, and their gradients; `GATHERED_BLOCKS` x B x b: a block's
  weights, gradients and reduce-scatter buffer) and, while gradients accumulate over a rank's
  micro-batches without being reduced (trainer.reduce_gradients step), the whole unsharded
  gradients (T x b). Sharded ranks take each block once per micro-batch (each completion after
  its own copy of the prompt: `engine.grouped`), so one micro-batch a step, or a reduction in
  each, frees a block's whole gradients as soon as its backward is done.

Activations of a micro-batch that computes t tokens (each group's prompt once, or before each
completion with fsdp, and the completions), c of them completions: t x L x (`LAYER_HIDDEN` x H
+ `LAYER_MLP` x I) x b held by the L decoder layers for and in the backward pass, and c x V x `LOGIT_COPIES` x 4 for the
float32 logits, log-softmax, entropy terms and their gradients. Activation checkpointing keeps
less per layer (`CHECKPOINT_HIDDEN`, `CHECKPOINT_MLP`), though not only each layer's input:
measured, it saves about half of a layer's share here, as the shared prompt's pass and the
completions' pass are both recomputed. The constants were fitted once to measured peaks
(single processes of small Llamas at several widths, depths, vocabularies and micro-batch sizes,
with and without checkpointing, then every row of `llamarl bench memory`, docs/benchmarks.md,
"Memory per trainer rank"), with glibc returning freed memory, as a trainer near the host's
memory has it do (`llamarl.launch.allocator.return_freed_memory`); one that keeps freed memory
(the default below a quarter of the host's) can peak higher.

On CUDA (not calibrated: no GPU was at hand) a rank's GPU holds the training terms less the
baseline plus `CUDA_CONTEXT_BYTES`; fsdp computes in bfloat16 there (gathered weights and
activations at 2 bytes), and trainer.offload moves the shards of weights and AdamW moments to the
host. The host then holds the baseline, the float32 model each rank builds before moving it, and
with offload the shards (`host_rank`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llamarl.config import LoraConfig, ModelConfig, TrainerConfig
from llamarl.engine.model import build_policy
from llamarl.errors import ConfigError
from llamarl.training.sharding import blocks

GiB = float(1 << 30)
BASELINE_BYTES = 440 << 20
"""A trainer process before its model: python, torch, transformers, llamarl, a gloo group."""
CUDA_CONTEXT_BYTES = 1 << 30
"""CUDA context and caching-allocator slack on each GPU (not measured here)."""
LAYER_HIDDEN = 17.0
"""Values of width H a decoder layer holds per token for its backward pass (and in it)."""
LAYER_MLP = 4.0
"""Values of width I (the MLP's) a decoder layer holds per token."""
CHECKPOINT_HIDDEN = 11.0
"""Values of width H a checkpointed decoder layer holds per token."""
CHECKPOINT_MLP = 2.0
"""Values of width I a checkpointed decoder layer holds per token."""
LOGIT_COPIES = 8.0
"""Vocabulary-wide float32 values per completion token, forward and backward together."""
ROOT_COPIES = 2
"""Whole copies of the root's own parameters fsdp holds through a pass (weights, gradients)."""
GATHERED_BLOCKS = 3
"""Blocks' worth of whole tensors fsdp holds besides (a block's weights, gradients, buffer)."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model, counted on the meta device."""

    num_params: int
    num_trained: int
    """Parameters with gradients and AdamW moments: all, or the LoRA adapters."""
    num_root_params: int
    """Parameters outside the decoder blocks (embeddings, output layer, final norm)."""
    num_block_params: int
    """Parameters of the largest decoder block (with its adapters)."""
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int


@dataclass(frozen=True)
class Workload:
    """What one step asks of a rank."""

    prompt_tokens: int
    """A micro-batch's prompt tokens, each group's prompt once."""
    completion_tokens: int
    """A micro-batch's completion tokens (they get logits)."""
    num_samples: int = 1
    """Completions a prompt (sharded ranks compute each prompt this many times)."""
    micro_batches: int = 1
    """A rank's micro-batches a step."""
    warm_start_tokens: int = 0
    """Tokens of a warm-start (SFT) batch on rank 0; 0: no warm start."""
    reference: bool = False
    """A whole reference copy of the model (KL penalty without LoRA)."""

    def tokens(self, one_pass: bool) -> int:
        """Tokens one micro-batch computes: each prompt once, or once per completion."""
        return self.completion_tokens + self.prompt_tokens * (self.num_samples if one_pass else 1)


@dataclass(frozen=True)
class Estimate:
    """One rank's peak, in bytes by term, and the phase it is reached in."""

    phase: str
    terms: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.terms.values())


def adapter_params(model: torch.nn.Module, lora: LoraConfig) -> int:
    """LoRA's parameters on `model`: r x (in + out) for every 2-D weight of a layer whose name
    is, or ends with, one of the target modules (peft's rule)."""
    count = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        targeted = any(name == t or name.endswith("." + t) for t in lora.target_modules)
        if targeted and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            count += lora.r * (weight.shape[0] + weight.shape[1])
    return count


def shape_of(model: torch.nn.Module, lora: LoraConfig | None) -> ModelShape:
    """The shape of a (meta or real) Hugging Face causal LM, with `lora`'s adapters."""
    num_params = sum(p.numel() for p in model.parameters())
    found = blocks(model)
    block_sizes = [sum(p.numel() for p in block.parameters()) for block in found]
    adapters = adapter_params(model, lora) if lora is not None else 0
    per_block = adapters // max(1, len(found))
    text = model.config.get_text_config()  # type: ignore[union-attr,operator]
    hidden = int(text.hidden_size)
    return ModelShape(
        num_params=num_params,
        num_trained=adapters if lora is not None else num_params,
        num_root_params=num_params - sum(block_sizes),
        num_block_params=max(block_sizes, default=0) + per_block,
        num_layers=len(found) or int(text.num_hidden_layers),
        hidden_size=hidden,
        intermediate_size=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        vocab_size=int(text.vocab_size),
    )


def model_shape(config: ModelConfig) -> ModelShape:
    """The configured model's shape, counted without allocating its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        if config.path is None:
            return shape_of(build_policy(config, seed=0).model, config.lora)
        try:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config.path, local_files_only=True))
        except (OSError, ValueError) as err:  # not a causal LM transformers knows
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"model.path {config.path}: {first}") from None
        return shape_of(model, config.lora)


class Shapes:
    """Model shapes by model config, each counted once (the settings offered change LoRA)."""

    def __init__(self) -> None:
        self._known: dict[str, ModelShape] = {}

    def of(self, config: ModelConfig) -> ModelShape:
        key = config.model_dump_json()
        if key not in self._known:
            self._known[key] = model_shape(config)
        return self._known[key]


def activation_bytes(shape: ModelShape, trainer: TrainerConfig, tokens: int, completion_tokens: int, width: int) -> int:
    """One micro-batch's activations (values of `width` bytes) and float32 logits."""
    hidden, mlp = LAYER_HIDDEN, LAYER_MLP
    if trainer.activation_checkpointing:
        hidden, mlp = CHECKPOINT_HIDDEN, CHECKPOINT_MLP
    layer = hidden * shape.hidden_size + mlp * shape.intermediate_size
    logits = completion_tokens * shape.vocab_size * LOGIT_COPIES * 4
    return int(tokens * shape.num_layers * layer * width + logits)


def _width(trainer: TrainerConfig) -> int:
    return 2 if trainer.dtype == "bfloat16" else 4


def _warm_start(
    shape: ModelShape, trainer: TrainerConfig, work: Workload, base: dict[str, int], leader: bool
) -> list[Estimate]:
    """Rank 0's warm start as a phase, when it has one."""
    if not (leader and work.warm_start_tokens):
        return []
    width, tokens = _width(trainer), work.warm_start_tokens
    return [
        Estimate(
            "warm start",
            base
            | {
                "training state": 5 * shape.num_params * width,
                "activations": activation_bytes(shape, trainer, tokens, tokens, width),
            },
        )
    ]


def estimate_rank(shape: ModelShape, trainer: TrainerConfig, work: Workload, leader: bool = True) -> Estimate:
    """One trainer rank's peak on the host, computing there (`leader`: rank 0, which
    warm-starts)."""
    width = _width(trainer)
    built = shape.num_params * 4 + (shape.num_params * width if width != 4 else 0)
    base = {"baseline": BASELINE_BYTES}
    phases = [Estimate("construction", base | {"model": built})]
    phases += _warm_start(shape, trainer, work, base, leader)
    phases.append(Estimate("training", training_terms(shape, trainer, work, width, width)))
    return max(phases, key=lambda estimate: estimate.total)


def estimate_gpu(shape: ModelShape, trainer: TrainerConfig, work: Workload, leader: bool = True) -> Estimate:
    """One cuda rank's peak on its GPU (not calibrated; see the module docstring)."""
    width = _width(trainer)
    compute = 2 if trainer.sharding == "fsdp" and trainer.ranks > 1 else width
    base = {"cuda context": CUDA_CONTEXT_BYTES}
    terms = base | training_terms(shape, trainer, work, width, compute)
    terms.pop("baseline")
    if trainer.offload:
        terms.pop("weights")
        terms.pop("optimizer")
    phases = [Estimate("training", terms), *_warm_start(shape, trainer, work, base, leader)]
    return max(phases, key=lambda estimate: estimate.total)


def host_rank(shape: ModelShape, trainer: TrainerConfig, work: Workload, leader: bool) -> int:
    """One trainer rank's peak on the host: all of it on cpu; on cuda the baseline, the float32
    model it builds before moving it, and with offload the shards kept in host memory."""
    if trainer.device == "cpu":
        return estimate_rank(shape, trainer, work, leader).total
    offloaded = 0
    if trainer.offload:
        offloaded = (shape.num_params + 2 * shape.num_trained) * _width(trainer) // trainer.ranks
    return BASELINE_BYTES + shape.num_params * 4 + offloaded


def training_terms(
    shape: ModelShape, trainer: TrainerConfig, work: Workload, width: int, compute_width: int
) -> dict[str, int]:
    """The training phase's terms (see the module docstring)."""
    ranks = trainer.ranks
    fsdp = trainer.sharding == "fsdp" and ranks > 1
    shards = ranks if fsdp else 1
    trained = shape.num_trained * width
    terms = {
        "baseline": BASELINE_BYTES,
        "weights": shape.num_params * width // shards,
        "gradients": trained // shards,
        "optimizer": 2 * trained // shards,
        "activations": activation_bytes(
            shape, trainer, work.tokens(one_pass=fsdp), work.completion_tokens, compute_width
        ),
    }
    if work.reference:
        terms["reference"] = shape.num_params * width
    if trainer.sharding == "ddp" and ranks > 1:
        terms["gradient buckets"] = trained
    if fsdp and trainer.reduce_gradients == "step" and work.micro_batches > 1:
        terms["unsharded gradients"] = trained
    if fsdp:
        gathered = ROOT_COPIES * shape.num_root_params + GATHERED_BLOCKS * shape.num_block_params
        terms["gathered"] = gathered * compute_width
    return terms
