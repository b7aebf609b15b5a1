"""`llamarl bench adapters`: what LoRA adapters cost a generator's decoding, measured.

A generator with LoRA can compute with peft's layers as they are (the base output plus the
low-rank update, two small extra matmuls a layer) or merge each version's update into the base
weights (decoding then costs what the plain model costs, but every version needs a merge, and a
copy of each adapted weight to merge the next one into). This times one generation batch of the
config both ways, interleaved (plain, adapters, plain, ...), each in a process of its own at the
given threads (`llamarl.bench.decode_probe`), and reports the medians, their spread and the
adapters' cost as a ratio; and the bytes a version moves with the adapters against the whole
model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamarl.bench.decode_probe import batch_seconds
from llamarl.bench.stats import spread
from llamarl.config import LoraConfig, parse_config
from llamarl.config.run import read_tree
from llamarl.engine.adapters import with_adapters
from llamarl.engine.model import make_policy
from llamarl.weightsync.flat import num_values


def bench(config: Path, pairs: int, threads: int, prompts: int) -> dict[str, Any]:
    tree = read_tree(Path(config))
    model = dict(tree.get("model", {}))
    lora = model.pop("lora", None) or LoraConfig().model_dump()
    plain_tree = tree | {"model": model}
    lora_tree = tree | {"model": model | {"lora": lora}}
    full = parse_config(plain_tree)
    policy = make_policy(full.model, full.seed)
    whole_bytes = num_values(policy.model) * 4
    version_bytes = num_values(with_adapters(policy, LoraConfig(**lora)).model) * 4
    plain, adapted = [], []
    for _ in range(pairs):
        plain.append(batch_seconds(plain_tree, threads, prompts))
        adapted.append(batch_seconds(lora_tree, threads, prompts))
    return {
        "bench": "adapters",
        "config": str(config),
        "lora": lora,
        "threads": threads,
        "prompts": prompts,
        "plain_or_merged_s": spread(plain),
        "peft_layers_s": spread(adapted),
        "peft_over_merged": spread([a / p for a, p in zip(adapted, plain, strict=True)]),
        "pairs": pairs,
        "version_bytes": version_bytes,
        "full_model_bytes": whole_bytes,
        "version_fraction": round(version_bytes / whole_bytes, 5),
    }
