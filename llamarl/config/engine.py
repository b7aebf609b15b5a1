"""`generation.vllm`: the options of a vLLM engine (`generation.engine: vllm`), each bounded.

They are checked here alone; what needs the machine (vLLM installed, a GPU for the CUDA-only
options) is checked before a run starts (`llamarl.launch.engine_checks`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llamarl.config.base import _Section


class VllmConfig(_Section):
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The engine's weight and compute dtype. auto: bfloat16 where the device computes it (a
    CUDA GPU with bfloat16, or a CPU with AVX-512 BF16 or AMX), else float32. Versions arrive
    in float32 and are cast on the way in; behaviour log-probs are computed in float32 from the
    engine's logits."""
    kv_cache_gb: float = Field(1.0, gt=0, le=4096)
    """Memory for the key/value cache, in GiB (its pages hold every running sequence)."""
    max_model_len: int | None = Field(None, ge=16, le=1_048_576)
    """Longest prompt plus completion the engine serves (null: the model's own)."""
    prefix_caching: bool = True
    """Reuse the keys and values of a prompt's prefix across requests (a group's n samples,
    and episodes' shared turns). Cleared on every new version."""
    eager: bool = True
    """Run the model eagerly: no CUDA graphs or torch.compile. Compiling costs minutes of
    start-up on a CPU; on a GPU, false is faster once started."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """GPUs one engine spreads the model over (CUDA only)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """The share of the GPU's memory the engine may take for weights and cache (CUDA only);
    the key/value cache is kv_cache_gb, whichever device."""
