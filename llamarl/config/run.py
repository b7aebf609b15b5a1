"""The whole run config (`RunConfig`), its cross-section checks, and loading it: YAML, then
environment overrides, then validation with one-line errors."""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from llamarl.config.base import FieldConflict, _Section
from llamarl.config.environment import EnvironmentConfig
from llamarl.config.evaluation import EvaluationConfig
from llamarl.config.learning import AlgorithmConfig, TrainerConfig
from llamarl.config.recipes import merged, with_recipe
from llamarl.config.sampling import SamplingConfig
from llamarl.config.sections import (
    BrokerConfig,
    GenerationConfig,
    LoggingConfig,
    ModelConfig,
    RedisConfig,
    StalenessConfig,
    WorkersConfig,
)
from llamarl.config.sync import AutoSync, SyncConfig
from llamarl.config.task import TaskConfig
from llamarl.errors import ConfigError

BUILT_MODEL_SFT_STEPS = 300
"""The built character model's warm start when `trainer.sft_steps` is unset."""


class RunConfig(_Section):
    recipe: str | None = None
    """A preset of algorithm options laid under this config's own (`llamarl.config.recipes`:
    dapo, gspo or dr_grpo); what the config or an override sets wins."""
    run_id: str = Field("llamarl", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Names the run; every Redis key is under llamarl:<run_id>:."""
    run_dir: str = "runs/llamarl"
    """Directory for the resolved config, logs, metrics and checkpoints."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Seed for model init, data and sampling."""
    redis: RedisConfig = RedisConfig()
    broker: BrokerConfig = BrokerConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    generation: GenerationConfig = GenerationConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    sampling: SamplingConfig = SamplingConfig()
    trainer: TrainerConfig = TrainerConfig()
    staleness: StalenessConfig = StalenessConfig()
    sync: SyncConfig = AutoSync()
    workers: WorkersConfig = WorkersConfig()
    logging: LoggingConfig = LoggingConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    """Multi-turn episodes with an environment and tools (null kind: single-turn)."""
    evaluation: EvaluationConfig = EvaluationConfig()
    """Named evaluation sets besides the task's held-out prompts (pass@k, mean@k)."""

    @model_validator(mode="before")
    @classmethod
    def _warm_start_default(cls, tree: Any) -> Any:
        """Only the built character model, which starts knowing nothing, is warm-started unless
        the config says otherwise; a model of the user's own never is."""
        if not isinstance(tree, dict):
            return tree
        model, trainer = tree.get("model") or {}, tree.get("trainer") or {}
        if not isinstance(model, dict) or not isinstance(trainer, dict):
            return tree
        if model.get("path") is None and "sft_steps" not in trainer:
            return tree | {"trainer": trainer | {"sft_steps": BUILT_MODEL_SFT_STEPS}}
        return tree

    @model_validator(mode="after")
    def _sections_agree(self) -> RunConfig:
        # Both advantages are group baselines: a group of one has none, so every advantage is 0.
        if self.generation.num_samples < 2:
            raise FieldConflict(
                ("generation.num_samples", "algorithm.advantage"),
                f"{self.algorithm.advantage} needs 2 or more samples a prompt to learn anything",
            )
        if self.trainer.ranks > self.trainer.prompts_per_step:
            raise FieldConflict(
                ("trainer.ranks", "trainer.prompts_per_step"),
                f"{self.trainer.ranks} ranks share {self.trainer.prompts_per_step} groups a step; "
                "every rank needs one at least",
            )
        if self.sampling.dynamic_sampling and self.algorithm.kl_in == "reward":
            raise FieldConflict(
                ("sampling.dynamic_sampling", "algorithm.kl_in"),
                "dynamic sampling skips groups whose task rewards are equal, but with the KL in "
                "the reward such a group still has advantages; put the KL in the loss",
            )
        generation = self.generation
        if self.sampling.overlong != "off" and generation.min_new_tokens >= generation.max_new_tokens:
            raise FieldConflict(
                ("sampling.overlong", "generation.min_new_tokens"),
                f"with EOS banned for all {generation.max_new_tokens} tokens every completion is "
                "truncated, so overlong shaping would treat them all alike",
            )
        model = self.model
        if model.lora is not None and self.trainer.sft_steps:
            raise FieldConflict(
                ("model.lora", "trainer.sft_steps"),
                "generators put the adapters on the base they load, so the trainer's base must "
                "be that one: warm-start first (`llamarl sft CONFIG --out DIR`), then set "
                "model.path: DIR and trainer.sft_steps: 0",
            )
        if self.environment.kind is not None:
            self._episodes_agree()
        serves = self.generation.serve_openai
        if serves is not None and serves != (self.environment.kind == "agent"):
            raise FieldConflict(
                ("generation.serve_openai", "environment.kind"),
                "the endpoint serves the episodes of agents, and an agent needs it: leave "
                "serve_openai null, or set it true with environment.kind: agent",
            )
        if model.path is None and self.generation.max_new_tokens >= model.max_position_embeddings:
            raise FieldConflict(
                ("generation.max_new_tokens", "model.max_position_embeddings"),
                f"{self.generation.max_new_tokens} new tokens leave no room for a prompt in "
                f"{model.max_position_embeddings} positions",
            )
        return self

    @model_validator(mode="after")
    def _tool_format_agrees(self) -> RunConfig:
        """A family's own tool format is written by the model's chat template."""
        if self.environment.tool_format not in ("auto", "llamarl") and not self.model.chat_template:
            raise FieldConflict(
                ("environment.tool_format", "model.chat_template"),
                f"tool format {self.environment.tool_format} is written by the model's chat template; "
                "set model.chat_template: true (an instruct model's), or tool_format: llamarl",
            )
        return self

    @model_validator(mode="after")
    def _chat_rows_agree(self) -> RunConfig:
        """Chat rows are prompts only a tokenizer's chat template can write."""
        if self.task.messages_field is None:
            return self
        if self.model.path is None:
            raise FieldConflict(
                ("task.messages_field", "model.path"),
                "chat rows need a chat template and the built model's character tokenizer has "
                "none; set model.path to an instruct model",
            )
        if not self.model.chat_template:
            raise FieldConflict(
                ("task.messages_field", "model.chat_template"),
                "chat rows are rendered through the tokenizer's chat template; set model.chat_template: true",
            )
        return self

    def _episodes_agree(self) -> None:
        """What single-turn completions have and episodes do not: a position-wise EOS ban and
        one completion length to shape rewards by."""
        if self.generation.min_new_tokens:
            raise FieldConflict(
                ("generation.min_new_tokens", "environment.kind"),
                "EOS ends each of an episode's turns; set generation.min_new_tokens: 0",
            )
        if self.trainer.sharding == "fsdp":
            raise FieldConflict(
                ("trainer.sharding", "environment.kind"),
                "fsdp ranks evaluate together, step for step, and an environment's timing can "
                "end an episode on one rank and not another; use sharding: ddp",
            )
        if self.evaluation.sets:
            raise FieldConflict(
                ("evaluation.sets", "environment.kind"),
                "evaluation sets are single-turn completions; an episode run evaluates its "
                "held-out prompts as episodes (drop evaluation.sets)",
            )
        if self.sampling.overlong != "off":
            raise FieldConflict(
                ("sampling.overlong", "environment.kind"),
                "an episode's length is its turns' and the environment's; bound it with "
                "environment.max_tokens and set sampling.overlong: off",
            )


_ENV_ALIASES = {
    "LLAMARL_REDIS_URL": ("redis", "url"),
    "LLAMARL_RUN_ID": ("run_id",),
    "LLAMARL_RUN_DIR": ("run_dir",),
}


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path)}: cannot override inside a non-mapping value")
        node = child
    node[path[-1]] = value


def apply_overrides(items: Sequence[str], environ: MutableMapping[str, str] | None = None) -> None:
    """Set command-line `section.field=value` items as the `LLAMARL__SECTION__FIELD` environment
    overrides they stand for, so this process and every process it starts apply them over the
    file and the environment. ConfigError for an item that is not `path=value`."""
    environ = os.environ if environ is None else environ
    for item in items:
        path, equals, value = item.partition("=")
        parts = path.split(".")
        if not equals or not all(part.isidentifier() for part in parts):
            raise ConfigError(f"override {item!r}: write section.field=value (for example trainer.lr=1e-5)")
        environ["LLAMARL__" + "__".join(part.upper() for part in parts)] = value


def env_overrides(environ: dict[str, str]) -> list[tuple[tuple[str, ...], Any]]:
    """The (field path, value) pairs the environment asks to override."""
    found: list[tuple[tuple[str, ...], Any]] = []
    for name, path in _ENV_ALIASES.items():
        if name in environ:
            found.append((path, environ[name]))
    if "LLAMARL_BROKER" in environ:
        host, _, port = environ["LLAMARL_BROKER"].rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"LLAMARL_BROKER: expected host:port, got {environ['LLAMARL_BROKER']!r}")
        found += [(("broker", "host"), host), (("broker", "port"), int(port))]
    for name, raw in environ.items():
        if name.startswith("LLAMARL__"):
            path = tuple(part.lower() for part in name[len("LLAMARL__") :].split("__"))
            found.append((path, yaml.safe_load(raw)))
    return found


def _format_validation_error(err: ValidationError) -> str:
    first = err.errors()[0]
    path = ".".join(str(part) for part in first["loc"]) or "<root>"
    conflict = first.get("ctx", {}).get("error")
    if isinstance(conflict, FieldConflict):
        prefix = [str(part) for part in first["loc"]]
        fields = ", ".join(".".join([*prefix, field]) for field in conflict.fields)
        return f"{fields}: {conflict.message}"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{path}: {first['msg']}{more}"


def parse_config(tree: dict[str, Any], environ: dict[str, str] | None = None) -> RunConfig:
    """Validate a config mapping after applying environment overrides."""
    tree = dict(tree)
    for path, value in env_overrides(dict(os.environ if environ is None else environ)):
        _set_path(tree, path, value)
    try:
        return RunConfig.model_validate(with_recipe(tree))
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> RunConfig:
    """Load and validate a YAML config file; raises ConfigError naming the bad field."""
    return parse_config(read_tree(Path(path)), environ)


def read_tree(path: Path, including: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML config file's mapping, laid over the file its `include` names (a path relative to
    it, included in turn) when it has one; ConfigError for what cannot be read."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    try:
        tree = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    include = tree.pop("include", None)
    if include is None:
        return tree
    if not isinstance(include, str):
        raise ConfigError(f"{path}: include must be a file path")
    base = (path.parent / include).resolve()
    if base in including or base == path.resolve():
        raise ConfigError(f"{path}: include {include} closes a cycle of includes")
    return merged(read_tree(base, (*including, path.resolve())), tree)


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, as written into the run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def writable_run_dir(config: RunConfig) -> Path:
    """The run directory, created when missing; ConfigError naming `run_dir` when this process
    cannot write there."""
    run_dir = Path(config.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise unwritable_run_dir(run_dir, err) from None
    return run_dir


def unwritable_run_dir(run_dir: Path, err: OSError) -> ConfigError:
    return ConfigError(
        f"run_dir {run_dir}: cannot write there ({err.strerror}); set run_dir (or "
        "LLAMARL_RUN_DIR) to a writable directory"
    )
