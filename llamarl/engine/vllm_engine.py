"""A vLLM engine inside the generator's process (`generation.engine: vllm`).

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): it started in 3 s
where its own process took 11 s (SmolLM2-135M on this repository's 2-core machine), and a
version's weights reach its worker as tensors, with nothing serialised between processes.

- **Versions** come in through the generator's weight receiver, as with the native engine (every
  channel, its version, layout and checksum checks): the receiver puts them in the generator's
  staging model, and `load` hands that model's tensors to vLLM's own loading path
  (`reload_weights` with checkpoint-format names, which re-runs the model's weight processing).
  LoRA versions are merged into the base weights on the way (`merged_weights`). After a load,
  every cached key and value is dropped, those of running sequences too (they are recomputed
  with the new weights), so no key or value of an older version is used again.
- **Behaviour log-probs** are vLLM's `processed_logprobs`: the log-prob of each sampled token
  under the distribution it was drawn from, after EOS is banned below `min_new_tokens`, after
  temperature and top-p, in float32, as the native sampler records them.
- **Sampling** is seeded per request from the generator's seeded stream. Token ids go in and come
  out: nothing is decoded and encoded again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch

from llamarl.config import VllmConfig
from llamarl.engine.adapters import has_adapters
from llamarl.engine.continuous import Sampler
from llamarl.engine.model import Policy
from llamarl.engine.sampling import SampleBatch, check_contexts, left_pad

ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "WARNING",
}
"""The engine core in this process, its threads on the cores this process was given, and its
log kept to warnings (at info it writes a line to stdout for every version loaded)."""


def set_vllm_environment() -> None:
    """ENVIRONMENT's values where the environment does not set them; before vLLM is imported."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def engine_dtype(config: VllmConfig, device: str) -> Literal["float32", "bfloat16"]:
    """The dtype `config.dtype` stands for on `device`: auto is bfloat16 where it computes it."""
    if config.dtype != "auto":
        return config.dtype
    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if torch.cpu._is_avx512_bf16_supported() else "float32"


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights under their Hugging Face names: a LoRA model's adapters merged into
    each adapted weight (its base left as it is)."""
    if not has_adapters(model):
        yield from model.state_dict().items()
        return
    base: Any = model.get_base_model()  # type: ignore[operator]
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        if name.endswith(".base_layer.weight"):
            path = name.removesuffix(".base_layer.weight")
            layer = base.get_submodule(path)
            yield f"{path}.weight", tensor + layer.get_delta_weight("default").to(tensor.dtype)
        else:
            yield name.replace(".base_layer.", "."), tensor


class VllmEngine:
    """One vLLM engine: started on a model directory, loaded with each version, asked for
    samples as a whole batch (`sample`) or request by request (`llamarl.engine.vllm_batch`)."""

    def __init__(self, llm: Any, eos_id: int, start_s: float) -> None:
        self.llm = llm
        self.eos_id = eos_id
        self.start_s = start_s
        """Seconds the engine took to start."""

    @classmethod
    def start(cls, model_dir: str, config: VllmConfig, device: str, eos_id: int, seed: int) -> VllmEngine:
        set_vllm_environment()
        # vLLM cuts a CPU process to one torch thread unless OMP_NUM_THREADS says how many.
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        from vllm import LLM

        keep_set_num_threads = torch.set_num_threads  # its CPU worker replaces it with a no-op
        started = time.perf_counter()
        options: dict[str, Any] = {}
        if device == "cuda":
            options = {
                "tensor_parallel_size": config.tensor_parallel_size,
                "gpu_memory_utilization": config.gpu_memory_utilization,
            }
        try:
            llm = LLM(
                model=model_dir,
                dtype=engine_dtype(config, device),
                seed=seed,
                max_model_len=config.max_model_len,
                enable_prefix_caching=config.prefix_caching,
                enforce_eager=config.eager,
                kv_cache_memory_bytes=int(config.kv_cache_gb * 2**30),
                logprobs_mode="processed_logprobs",
                async_scheduling=False,
                **options,
            )
        finally:
            torch.set_num_threads = keep_set_num_threads
        return cls(llm, eos_id, time.perf_counter() - started)

    def load(self, model: torch.nn.Module) -> None:
        """Make the engine's weights `model`'s (through vLLM's loading path); drop every cached
        key and value, running sequences' too."""
        with torch.no_grad():
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": merged_weights(model), "is_checkpoint_format": True},
            )
        self.llm.llm_engine.reset_prefix_cache(reset_running_requests=True)

    def params(self, sampler: Sampler, delta: bool = False) -> Any:
        """vLLM's SamplingParams for one prompt's n completions as `sampler` says, seeded from
        its stream, stopping at our EOS alone and returning each token's behaviour log-prob;
        `delta`: each step's output holds only the new tokens."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        generator = sampler.generator
        device = generator.device if generator is not None else "cpu"
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=device))
        return SamplingParams(
            n=sampler.num_samples,
            max_tokens=sampler.max_new_tokens,
            min_tokens=sampler.min_new_tokens,
            temperature=0.0 if sampler.greedy else sampler.temperature,
            top_p=1.0 if sampler.greedy else sampler.top_p,
            seed=seed,
            logprobs=0,
            ignore_eos=True,
            stop_token_ids=[self.eos_id],
            detokenize=False,
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
        )

    def sample(
        self,
        policy: Policy,
        prompts: list[list[int]],
        *,
        num_samples: int,
        max_new_tokens: int,
        min_new_tokens: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> SampleBatch:
        """What `llamarl.engine.sampling.sample` returns, sampled by vLLM."""
        from vllm.inputs import TokensPrompt

        check_contexts(prompts)
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampler = Sampler(num_samples, max_new_tokens, min_new_tokens, temperature, top_p, generator, greedy)
        params = [self.params(sampler) for _ in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        rows = [(list(c.token_ids), token_logprobs(c)) for out in outputs for c in out.outputs]
        prompt_ids, prompt_mask = left_pad([list(p) for p in prompts], policy.pad_id)
        return completions_batch(
            prompt_ids.repeat_interleave(num_samples, dim=0),
            prompt_mask.repeat_interleave(num_samples, dim=0),
            rows,
            policy.pad_id,
        )


def token_logprobs(completion: Any) -> list[float]:
    """The behaviour log-prob of each token of a vLLM CompletionOutput (logprobs=0 keeps the
    sampled token's alone)."""
    return [float(step[token].logprob) for token, step in zip(completion.token_ids, completion.logprobs, strict=True)]


def completions_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    rows: Sequence[tuple[list[int], list[float]]],
    pad_id: int,
) -> SampleBatch:
    """A SampleBatch of (token ids, log-probs) rows, right-padded."""
    width = max(1, max(len(ids) for ids, _ in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    logprobs = torch.zeros((len(rows), width))
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (tokens, logps) in enumerate(rows):
        ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        logprobs[i, : len(tokens)] = torch.tensor(logps)
        mask[i, : len(tokens)] = 1
    return SampleBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=ids,
        completion_mask=mask,
        logprobs=logprobs,
    )
