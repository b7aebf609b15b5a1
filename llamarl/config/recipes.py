"""Named presets of the algorithm options the field uses (`recipe: NAME` in a config, or
`--recipe NAME` / `recipe=NAME` on the command line): each is a partial config laid under the
config's own values, so anything the config or an override sets wins over the preset.

- `dapo` (DAPO, Yu et al. 2025): PPO-clip with the decoupled range 0.8-1.28 (clip-higher),
  token-mean aggregation over the batch, no KL, dynamic sampling (groups with equal rewards
  skipped) and the overlong penalty over the last 20% of the length limit.
- `gspo` (GSPO, Zheng et al. 2025): the sequence-level ratio (geometric mean of the token
  ratios) clipped at sequence level in 1 - 3e-4 .. 1 + 4e-4, sequences averaged.
- `dr_grpo` (Dr. GRPO, Liu et al. 2025): advantages centred but not divided by the group's std,
  each sequence's summed loss divided by a constant (the longest completion), no KL.
"""

from __future__ import annotations

import copy
from typing import Any

from llamarl.errors import ConfigError

RECIPES: dict[str, dict[str, Any]] = {
    "dapo": {
        "algorithm": {
            "loss": "ppo_clip",
            "clip_low": 0.8,
            "clip_high": 1.28,
            "aggregation": "token_mean",
            "kl_coef": 0.0,
        },
        "sampling": {"dynamic_sampling": True, "overlong": "penalty", "overlong_band": 0.2, "overlong_penalty": 1.0},
    },
    "gspo": {
        "algorithm": {
            "loss": "ppo_clip",
            "ratio_level": "sequence",
            "clip_low": 1 - 3e-4,
            "clip_high": 1 + 4e-4,
            "aggregation": "sequence_mean",
        },
    },
    "dr_grpo": {
        "algorithm": {"advantage": "grpo", "grpo_scale_by_std": False, "aggregation": "constant_sum", "kl_coef": 0.0},
    },
}


def merged(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `under`: mappings merge key by key, anything else in `over` wins."""
    tree = copy.deepcopy(under)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = merged(tree[key], value)
        else:
            tree[key] = copy.deepcopy(value)
    return tree


def with_recipe(tree: dict[str, Any]) -> dict[str, Any]:
    """The config tree with its `recipe`'s preset laid under it (itself without a recipe);
    ConfigError naming the recipes for an unknown one."""
    name = tree.get("recipe")
    if name is None:
        return tree
    if name not in RECIPES:
        raise ConfigError(f"recipe: unknown {name!r}; use one of {', '.join(sorted(RECIPES))}")
    return merged(RECIPES[name], tree)
