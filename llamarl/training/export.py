"""`llamarl export RUN_DIR OUT`: a run's model as a standalone Hugging Face model directory.

The final model of a finished run (RUN_DIR/model), or else the model of the run's newest complete
checkpoint (a stopped or crashed run; a sharded one's shards put together into whole tensors),
copied to OUT: loadable with
`AutoModelForCausalLM.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)`, with no
llamarl state in it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llamarl.engine.model import architecture_of, save_policy
from llamarl.errors import ConfigError
from llamarl.training.checkpoint import PREFIX, TMP
from llamarl.training.sharded_checkpoint import is_sharded, load_weights

FINAL_MODEL = "model"
"""Where a finished run's model goes, in Hugging Face format (RUN_DIR/model)."""


def model_of(run_dir: Path) -> Path:
    """The run's final model, else its newest complete checkpoint's; ConfigError when neither."""
    if (run_dir / FINAL_MODEL / "config.json").exists():
        return run_dir / FINAL_MODEL
    checkpoints = sorted(
        path for path in (run_dir / "checkpoints").glob(f"{PREFIX}*")
        if not path.name.endswith(TMP) and (path / "model" / "config.json").exists()
    )  # fmt: skip
    if not checkpoints:
        raise ConfigError(
            f"{run_dir}: no final model ({FINAL_MODEL}/) and no complete checkpoint; give the "
            "run directory of a run that trained"
        )
    return checkpoints[-1] / "model"


def write_model(checkpoint: Path, out: Path) -> None:
    """The whole model of a sharded checkpoint as a Hugging Face directory (read by this
    process alone)."""
    policy = architecture_of(checkpoint / "model")
    load_weights(policy.model, checkpoint)
    save_policy(policy, out)


def export(run_dir: Path, out: Path) -> Path:
    """Copy the run's model to `out` (which must not exist or be empty), put together from the
    shards of a sharded checkpoint; the source."""
    source = model_of(run_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty; give a new directory")
    if source.name != FINAL_MODEL and is_sharded(source.parent):
        write_model(source.parent, out)
    else:
        shutil.copytree(source, out, dirs_exist_ok=True)
    return source
