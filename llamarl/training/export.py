"""`llamarl export RUN_DIR OUT`: a run's model as a standalone Hugging Face model directory.

The final model of a finished run (RUN_DIR/model), or else the model of the run's newest complete
checkpoint (a stopped or crashed run; a sharded one's shards put together into whole tensors,
LoRA adapters merged into their base), written to OUT: loadable with
`AutoModelForCausalLM.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)`, with no
llamarl state in it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llamarl.engine.adapters import has_adapters, merged, save_adapters
from llamarl.engine.model import Policy, save_policy
from llamarl.errors import ConfigError
from llamarl.training.checkpoint import CheckpointStore
from llamarl.training.sharded_checkpoint import is_sharded, load_weights

FINAL_MODEL = "model"
"""Where a finished run's model goes, in Hugging Face format (RUN_DIR/model)."""
FINAL_ADAPTER = "adapter"
"""Where a finished LoRA run's adapters go, as a peft adapter directory (RUN_DIR/adapter)."""


def newest_checkpoint(run_dir: Path) -> Path:
    """The run's newest complete checkpoint; ConfigError when it has none (nor a final model)."""
    checkpoints = CheckpointStore(run_dir / "checkpoints", run_id="", keep=1).complete()
    if not checkpoints:
        raise ConfigError(
            f"{run_dir}: no final model ({FINAL_MODEL}/) and no complete checkpoint; give the "
            "run directory of a run that trained"
        )
    return checkpoints[-1]


def checkpoint_model(checkpoint: Path) -> Policy:
    """A checkpoint's whole model (with its adapters, if it has them), read by this process
    alone: a sharded one's shards put together."""
    policy = CheckpointStore(checkpoint.parent, run_id="", keep=1).policy_of(checkpoint)
    if is_sharded(checkpoint):
        load_weights(policy.model, checkpoint)
    return policy


def save_final(policy: Policy, run_dir: Path) -> None:
    """A finished run's model in RUN_DIR/model; with adapters, they go to RUN_DIR/adapter and
    RUN_DIR/model gets the base with them merged in."""
    if has_adapters(policy.model):
        save_adapters(policy, run_dir / FINAL_ADAPTER)
        policy = merged(policy)
    save_policy(policy, run_dir / FINAL_MODEL)


def export(run_dir: Path, out: Path) -> Path:
    """Write the run's model to `out` (which must not exist or be empty): its final model, else
    its newest checkpoint's (adapters merged in); the source."""
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty; give a new directory")
    final = run_dir / FINAL_MODEL
    if (final / "config.json").exists():
        shutil.copytree(final, out, dirs_exist_ok=True)
        return final
    checkpoint = newest_checkpoint(run_dir)
    policy = checkpoint_model(checkpoint)
    if has_adapters(policy.model):
        policy = merged(policy)
    save_policy(policy, out)
    return checkpoint
