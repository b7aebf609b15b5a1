"""docs/benchmarks.md's smaller benches: continuous batching against static, a sandboxed Python
call, what LoRA adapters cost a generator, and what a trainer crash costs a run."""

from __future__ import annotations

from tables.figures import counted, load, of, rounded, spread, thousands


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


def resume() -> list[str]:
    """`llamarl bench resume`: an undisturbed run against one whose trainer is SIGKILLed, pair by
    pair: the tickets each issued, dropped, reopened and reissued, and its wall time."""
    result = load("resume.json")
    pairs = result["pairs"]

    def row(label: str, key: str, digits: int | None = None) -> str:
        """A count (`digits` None) or a figure to `digits` decimals, of each arm over the pairs."""
        cells = [of([pair[arm][key] for pair in pairs]) for arm in ("undisturbed", "crashed")]
        shown = [counted(c) if digits is None else spread(c, digits, "") for c in cells]
        return f"| {label} | {shown[0]} | {shown[1]} |"

    cost = of([pair["crashed"]["wall_s"] - pair["undisturbed"]["wall_s"] for pair in pairs])
    return [
        f"| {len(pairs)} pairs of {result['steps']} steps, median (min-max) | undisturbed "
        f"| trainer SIGKILLed at step {result['kill_at_step']} |",
        "|---|---|---|",
        row("tickets issued", "issued"),
        row("dropped as stale, % of issued", "dropped_pct", 2),
        row("tickets reopened (trained after the checkpoint, update lost)", "reopened"),
        row("tickets reissued to a generator", "reissued"),
        row("trainer restarts", "trainer_restarts"),
        row("wall time, s", "wall_s", 1),
        "",
        f"The crash costs **{spread(cost, 1, ' s')}** of wall time a run (crashed less undisturbed, pair by pair), "
        f"checkpoints every {result['checkpoint_every']} steps.",
    ]
