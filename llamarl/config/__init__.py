"""Run configuration: one validated schema for every role, loaded from YAML plus env overrides.

Every section forbids unknown keys and bounds its numbers, so a misspelt key or an out-of-range
value is refused before anything starts, with a one-line error naming the field path. Containers
override fields through the environment: `LLAMARL_REDIS_URL`, `LLAMARL_BROKER` (host:port),
`LLAMARL_RUN_ID`, or any field as `LLAMARL__SECTION__FIELD=value` (value parsed as YAML). The
commands take the same overrides as `section.field=value` after the config (`apply_overrides`).
"""

from llamarl.config.base import FieldConflict
from llamarl.config.engine import VllmConfig
from llamarl.config.environment import EnvironmentConfig
from llamarl.config.evaluation import EvalSetConfig, EvaluationConfig
from llamarl.config.learning import AlgorithmConfig, TrainerConfig
from llamarl.config.run import (
    RunConfig,
    apply_overrides,
    dump_config,
    env_overrides,
    load_config,
    parse_config,
    unwritable_run_dir,
    writable_run_dir,
)
from llamarl.config.sampling import SamplingConfig
from llamarl.config.sections import (
    BrokerConfig,
    GenerationConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    RedisConfig,
    StalenessConfig,
    WorkersConfig,
)
from llamarl.config.sync import (
    AutoSync,
    ConcreteSync,
    GlooSync,
    LocalSync,
    NcclSync,
    ShmSync,
    SyncConfig,
    transport_name,
)
from llamarl.config.task import JudgeConfig, TaskConfig, template_fields

__all__ = [
    "AlgorithmConfig",
    "AutoSync",
    "BrokerConfig",
    "ConcreteSync",
    "EnvironmentConfig",
    "EvalSetConfig",
    "EvaluationConfig",
    "FieldConflict",
    "GenerationConfig",
    "GlooSync",
    "JudgeConfig",
    "LocalSync",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "NcclSync",
    "RedisConfig",
    "RunConfig",
    "SamplingConfig",
    "ShmSync",
    "StalenessConfig",
    "SyncConfig",
    "TaskConfig",
    "TrainerConfig",
    "VllmConfig",
    "WorkersConfig",
    "apply_overrides",
    "dump_config",
    "env_overrides",
    "load_config",
    "parse_config",
    "template_fields",
    "transport_name",
    "unwritable_run_dir",
    "writable_run_dir",
]
