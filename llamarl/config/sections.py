"""The run config's sections other than `sync`, `algorithm`, `trainer` and `task`: Redis, broker,
model, generation, staleness, workers, logging. Each forbids unknown keys and bounds its
numbers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llamarl.config.base import FieldConflict, _Section, yaml_off
from llamarl.config.endpoint import EndpointConfig
from llamarl.config.engine import VllmConfig


class RedisConfig(_Section):
    url: str | None = None
    """redis://, rediss:// or unix:// URL (password/ACL user in the URL); null starts a private
    embedded one."""
    connect_deadline_s: float = Field(30.0, gt=0, le=3600)
    """How long a worker keeps retrying an unreachable Redis before it exits non-zero."""

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{url!r} is not a Redis URL: use redis://host:port/db or unix://path")
        return url


class BrokerConfig(_Section):
    host: str = "127.0.0.1"
    """Host the broker binds (or workers connect to)."""
    port: int | None = Field(None, ge=1024, le=65531)
    """Base port; the broker uses port..port+3. null picks free ports (embedded runs only)."""
    hwm: int = Field(1000, ge=1, le=1_000_000)
    """ZeroMQ high-water mark per socket: messages queued per peer before backpressure."""
    max_queue: int = Field(10_000, ge=1, le=10_000_000)
    """Messages the broker holds per work topic; when full it stops reading producers."""
    max_queue_bytes: int = Field(1 << 30, ge=1024, le=1 << 40)
    """Bytes the broker holds per work topic; when reached it stops reading producers too."""
    consumer_credit: int | None = Field(None, ge=1, le=1000)
    """Work messages a consumer may hold unacknowledged (prefetch). null sizes it to demand: a
    reward worker one generator batch, the trainer one step plus `max_staleness` steps ahead."""
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1 << 31)
    """Frames larger than this are refused: by ZeroMQ as they reach the broker (the sender's
    connection is dropped, nothing is buffered), and before decoding by every worker (counted)."""
    rate_limit_per_s: float = Field(20_000.0, ge=0, le=1e9)
    """Frames a second the broker accepts from one peer address (all processes of one host
    share it), checked before decoding; excess frames are rejected as `rate_limited`. 0: off."""
    rate_burst: int = Field(40_000, ge=1, le=1_000_000_000)
    """Frames a peer may send at once above its rate before the limit applies."""
    dead_after_s: float = Field(60.0, gt=0, le=86400)
    """A worker asks the broker for a sign of life every `workers.heartbeat_s`; one that gets no
    answer warns, keeps working (its sockets reconnect when the broker is back) and exits with
    code 3 and one line once the broker has not answered for this long."""
    reject_log_interval_s: float = Field(60.0, gt=0, le=86400)
    """A rejected-input reason is logged at most once per this interval, with its count."""
    curve_keys: str | None = None
    """Directory from `llamarl keys generate`: every ZeroMQ socket uses CURVE and servers let in
    only the public keys in DIR/authorized. null: plain TCP (trusted networks only)."""


class LoraConfig(_Section):
    """Low-rank adapters (peft's LoRA) on the frozen base model: the trainer trains and sends
    only these."""

    r: int = Field(16, ge=1, le=4096)
    """Rank of each adapter."""
    alpha: float = Field(32.0, gt=0, le=1e6)
    """Scale numerator: an adapter's update is multiplied by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    """Names of the linear layers that get adapters (default: Llama's attention projections;
    add gate_proj, up_proj, down_proj for the MLP, about 2.6x the adapter size)."""


class ModelConfig(_Section):
    path: str | None = None
    """Local Hugging Face causal-LM directory, or a hub id (`HuggingFaceTB/SmolLM2-135M-Instruct`)
    already in the local Hugging Face cache (HF_HUB_CACHE; nothing is downloaded); null builds a
    tiny Llama from the fields below."""
    chat_template: bool | str = False
    """Wrap every prompt in a chat template (instruct models): true, the tokenizer's own (an
    error when it has none); a path, the Jinja template in that file instead (for example
    configs/templates/chatml_hermes.jinja, ChatML with Hermes tool calls, for a model whose own
    template knows no tools); saved checkpoints and exports carry it."""
    hidden_size: int = Field(128, ge=8, le=16384)
    """Hidden width of the built model."""
    num_layers: int = Field(4, ge=1, le=128)
    """Decoder layers of the built model."""
    num_heads: int = Field(4, ge=1, le=128)
    """Attention heads of the built model."""
    intermediate_size: int = Field(256, ge=8, le=65536)
    """MLP width of the built model."""
    max_position_embeddings: int = Field(64, ge=8, le=131072)
    """Longest prompt + completion the built model handles."""
    extra_characters: str = Field("", max_length=200)
    """Characters the built model's character tokenizer has besides digits, `+-*= ` (a tool
    call's `<tool>{"calculator": ...}</tool>` needs `<>/{}":` and its letters)."""
    lora: LoraConfig | None = None
    """Train LoRA adapters on a frozen base instead of every weight (null: full fine-tuning).
    A version then carries the adapter tensors only; see docs/scaling-out.md, LoRA."""

    @model_validator(mode="after")
    def _fields_agree(self) -> ModelConfig:
        if self.path is not None:
            return self
        # The built model (path null) has the char tokenizer, which carries no chat template.
        if self.chat_template:
            raise FieldConflict(("chat_template", "path"), "the built model's tokenizer has no chat template")
        if self.hidden_size % self.num_heads:
            raise FieldConflict(
                ("hidden_size", "num_heads"),
                f"{self.hidden_size} is not a multiple of {self.num_heads} heads",
            )
        # Rotary embeddings rotate pairs of each head's dimensions.
        if (self.hidden_size // self.num_heads) % 2:
            raise FieldConflict(
                ("hidden_size", "num_heads"),
                f"head width {self.hidden_size // self.num_heads} is odd; RoPE needs an even one",
            )
        return self


class GenerationConfig(_Section):
    num_samples: int = Field(8, ge=1, le=1024)
    """Completions sampled per prompt (the group size for advantages)."""
    max_new_tokens: int = Field(6, ge=1, le=32768)
    """Longest completion."""
    min_new_tokens: int = Field(0, ge=0, le=32768)
    """EOS is not sampled before this many tokens (the trainer's pi masks it the same way), so
    completions have equal lengths when it is max_new_tokens - 1 and the model ends there."""
    prompts_per_batch: int = Field(8, ge=1, le=100_000)
    """Prompt tickets a generator claims and samples together in one batch."""
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature; behaviour log-probs are taken under the tempered distribution."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass; see docs/learning.md for how truncation enters mu and pi."""
    batching: Literal["continuous", "static"] = "continuous"
    """continuous: a finished completion leaves the running batch and a newly claimed prompt's
    samples join it between decode steps, so no sequence waits for the longest of its batch;
    static: a batch of `prompts_per_batch` prompts decodes until its longest completion ends
    (every earlier release). Multi-turn episodes batch each turn across episodes either way."""
    inflight_updates: bool = True
    """With continuous batching, a generator takes up a new version between two decode steps and
    its sequences go on with it (each token keeps the version that sampled it); a group whose
    oldest token falls more than `staleness.max_staleness` versions behind is restarted from its
    prompt. false: a new version waits until the running batch has drained."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where generators decode (and hold the weights they receive)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The generators' weight dtype: received float32 versions are cast to it on the way in
    (bfloat16 halves their memory, like LlamaRL's lower-precision generators; the AIPO weight
    corrects the mismatch)."""
    engine: Literal["native", "vllm"] = "native"
    """What samples: native, llamarl's own PyTorch loop (exact, no extra install); vllm, a vLLM
    engine in the generator's process (`pip install 'llamarl[vllm]'`; paged cache, prefix
    caching, CUDA graphs, tensor parallelism), options in generation.vllm. Either way every
    version reaches it through sync's channel and each token's behaviour log-prob is that of
    the distribution it was drawn from. See docs/engines.md."""
    vllm: VllmConfig = VllmConfig()
    """The vLLM engine's options (engine: vllm)."""
    serve_openai: bool | None = None
    """Serve an OpenAI-compatible endpoint (`/v1/chat/completions`, `/v1/completions`,
    `/v1/models`) that agents' episodes talk to the model through; null: on exactly when
    environment.kind is agent, the only episodes it serves. Options in generation.openai."""
    openai: EndpointConfig = EndpointConfig()
    """The endpoint's address and bounds (serve_openai)."""

    @model_validator(mode="after")
    def _fields_agree(self) -> GenerationConfig:
        if self.min_new_tokens > self.max_new_tokens:
            raise FieldConflict(
                ("min_new_tokens", "max_new_tokens"),
                f"{self.min_new_tokens} > {self.max_new_tokens}: EOS would be banned past the end",
            )
        if self.engine == "vllm" and self.batching == "static":
            raise FieldConflict(
                ("batching", "engine"),
                "vLLM schedules its own batch continuously; set batching: continuous",
            )
        return self


class StalenessConfig(_Section):
    max_staleness: int = Field(1, ge=0, le=1000)
    """Versions a rollout may lag the trainer before it is dropped (k)."""
    lease_s: float = Field(60.0, gt=0, le=86400)
    """A claimed prompt ticket is reissued when its lease is not renewed for this long."""


class LoggingConfig(_Section):
    """Where the trainer's per-step metrics go besides RUN_DIR/metrics.jsonl (always written)."""

    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard (`pip install
    'llamarl[tensorboard]'`; view with `tensorboard --logdir RUN_DIR/tensorboard`)."""
    wandb: Literal["off", "offline", "online"] = "off"
    """Also log to Weights & Biases (`pip install 'llamarl[wandb]'`): offline writes
    RUN_DIR/wandb, to upload later with `wandb sync`; online needs WANDB_API_KEY."""
    wandb_project: str = Field("llamarl", pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    """The W&B project the run is logged under (its name is run_id)."""

    @field_validator("wandb", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        return yaml_off(value)


class WorkersConfig(_Section):
    layout: Literal["auto", "split", "colocated", "one_process"] = "auto"
    """How `llamarl run` lays the roles out on the cores. auto: profile the config on this
    machine (cached), predict every split with the simulator against taking turns and start a
    split only where it is predicted faster by more than the simulator's tie, else one_process
    (printed, with the alternatives, and written to RUN_DIR/layout.json); split: trainer and
    generators side by side, the cores split by their measured work; colocated: one generator
    and the trainer processes, each on every core, taking turns (max_staleness 0); one_process:
    every role in the launcher's process, taking turns with the trainer's own weights (`--mode
    sync` runs this). Every layout keeps checkpoints, --resume and the ledger. See
    docs/scaling-out.md, Layout."""
    num_generators: int = Field(1, ge=1, le=1024)
    """Generator processes started by `llamarl run`."""
    num_reward: int = Field(1, ge=1, le=1024)
    """Reward worker processes started by `llamarl run`."""
    heartbeat_s: float = Field(2.0, gt=0, le=3600)
    """Interval between worker heartbeats."""
    heartbeat_ttl_s: float = Field(10.0, gt=0, le=86400)
    """A worker whose heartbeat is older than this is reported dead."""
    num_cores: int | None = Field(None, ge=1, le=4096)
    """Cores the run may use (null: every core the launcher may run on). `llamarl run` splits
    them between trainer and generators by their measured work; sync mode uses them all."""
    trainer_threads: int | None = Field(None, ge=1, le=1024)
    """torch threads for the trainer; null: its share of `num_cores` (see docs/scaling-out.md, Cores)."""
    generator_threads: int | None = Field(None, ge=1, le=1024)
    """torch threads per generator; null: their share of `num_cores`."""
    pin_cores: bool = True
    """`llamarl run` pins the trainer and each generator to cores of their own when they fit."""
    ray_resources: dict[Literal["trainer", "generator", "reward"], dict[str, float]] = Field(default_factory=dict)
    """`--launcher ray`: custom resources each worker of a role asks for besides its CPUs and
    GPUs, so it lands on the nodes that declare them (`ray start --resources
    '{"trainer_node": 1}'`); for example {trainer: {trainer_node: 1}, generator:
    {generator_node: 1}}. Empty: Ray places each worker wherever its CPUs and GPUs fit."""
    max_restarts: int = Field(3, ge=0, le=1000)
    """`llamarl run` restarts a dead worker (the trainer resumes from its checkpoint), and its own
    Redis and broker, up to this many times each within any `restart_window_s`; one more crash in
    the window ends the run."""
    restart_window_s: float = Field(600.0, gt=0, le=7 * 86400)
    """The window `max_restarts` counts over: crashes further apart than this never add up."""

    @model_validator(mode="after")
    def _fields_agree(self) -> WorkersConfig:
        # The liveness key expires after the TTL and is rewritten every beat.
        if self.heartbeat_ttl_s <= self.heartbeat_s:
            raise FieldConflict(
                ("heartbeat_ttl_s", "heartbeat_s"),
                "a live worker would be reported dead between beats; make the TTL longer",
            )
        return self
