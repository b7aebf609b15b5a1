"""docs/benchmarks.md's smaller benches: continuous batching against static, a sandboxed Python
call, and what LoRA adapters cost a generator."""

from __future__ import annotations

from tables.figures import load, rounded, spread, thousands


def batching() -> list[str]:
    """`llamarl bench batching`: generated tokens/s of static and continuous batching."""
    result = load("batching.json")
    rates = result["tokens_per_s"]
    tokens = [run["tokens"] for rows in result["runs"].values() for run in rows]
    lengths = [run["median_length"] for rows in result["runs"].values() for run in rows]
    return [
        "| | static | continuous |",
        "|---|---|---|",
        f"| generated tokens/s | {spread(rates['static'], 0, '')} | {spread(rates['continuous'], 0, '')} |",
        f"| tokens per arm (same prompts; the samples differ) | {thousands(min(tokens))}-{thousands(max(tokens))} "
        f"| median completion {min(lengths):g}-{max(lengths):g} tokens |",
        "",
        f"Continuous over static **{spread(result['continuous_over_static'])}**, {result['prompts']} prompts x "
        f"{result['num_samples']} samples an arm, {result['prompts_per_batch']} prompts' rows at a time, "
        f"{result['threads']} thread.",
    ]


def sandbox() -> list[str]:
    """`llamarl bench sandbox`: seconds a Python tool call takes, start to result."""
    result = load("sandbox.json")
    return [
        f"| {result['calls']} calls, interleaved | seconds a call, median (min-max) |",
        "|---|---|",
        f"| a call through the sandbox | {spread(result['call_s'], 3, '')} |",
        f"| a bare interpreter start | {spread(result['bare_interpreter_s'], 3, '')} |",
        f"| the sandbox's own cost | {spread(result['overhead_s'], 3, '')} |",
    ]


def adapters() -> list[str]:
    """`llamarl bench adapters`: a LoRA version's size and peft's layers' cost to decoding."""
    result = load("adapters.json")
    megabytes = {key: result[key] / 1e6 for key in ("version_bytes", "full_model_bytes")}
    return [
        f"A version is **{megabytes['version_bytes']:.2f} MB of adapters against "
        f"{megabytes['full_model_bytes']:.0f} MB for the whole model: {rounded(100 * result['version_fraction'])}%**. "
        f"Decoding a batch ({result['prompts']} prompts, {result['threads']} thread) with peft's layers on the base "
        f"takes {spread(result['peft_layers_s'], 2, ' s')} against {spread(result['plain_or_merged_s'], 2, ' s')} "
        f"for the plain model, which is what a generator that merged each version into its base would pay: the "
        f"unmerged adapters cost **{spread(result['peft_over_merged'])}** ({result['pairs']} interleaved pairs)."
    ]
