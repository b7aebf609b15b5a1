"""The tables of `llamarl bench async-vs-sync` results: the demo's (docs/benchmarks.md), the
calculator environment against the calculator agent and the calculator agent on SmolLM2
(docs/environments.md), SmolLM2 with vLLM generators (docs/engines.md) and the worked example of
docs/own-model.md."""

from __future__ import annotations

from typing import Any

from tables.figures import load, of, per_pair, rounded, spread, thousands


def _both(result: dict[str, Any], key: str) -> str:
    return " | ".join(spread(per_pair(result, mode, key), 3, "") for mode in ("sync", "async"))


def _solo(result: dict[str, Any], role: str) -> str:
    return spread(of([pair["solo"][role] for pair in result["pairs"]]), 3, "")


def _sync_phases(result: dict[str, Any]) -> str:
    roles = ("generate", "train")
    return ", ".join(
        f"{role} {spread(of([p['sync']['roles'][role] for p in result['pairs']]), 3, '')}" for role in roles
    )


def _async_roles(result: dict[str, Any], key: str, digits: int) -> str:
    roles = ("generator", "trainer")
    return ", ".join(
        f"{role} {spread(of([p['async']['roles'][role][key] for p in result['pairs']]), digits, '')}" for role in roles
    )


ABOVE_BOUND = " The RL speed-up is above its bound: the text below says why."
"""Said under a table whose RL speed-up passes its bound, which the page must then explain."""


def _above(result: dict[str, Any]) -> str:
    return ABOVE_BOUND if result["rl_efficiency"] > 1 else ""


def _summary(result: dict[str, Any]) -> str:
    """The sentence under each table: the speed-ups, the bound and the work both modes did."""
    counts = sorted({pair["sync"]["trained_tokens"] for pair in result["pairs"]})
    low, high = thousands(counts[0]), thousands(counts[-1])
    tokens = low if low == high else f"{low}-{high}"
    text = (
        f"Speed-up **{spread(result['speedup'])}**, run wall time per step; RL steps alone "
        f"{spread(result['rl_speedup'])}, bound {rounded(result['rl_bound'])}, efficiency "
        f"{rounded(result['rl_efficiency'])}; equal work: {'yes' if result['equal_work'] else 'no'} "
        f"({tokens} tokens generated and trained per run)"
    )
    if "async_extra_decode_fraction" in result:
        extra = result["async_extra_decode_fraction"]
        text += f", async's discarded decoding at most {rounded(100 * extra, 1)}%" if extra else ", none discarded"
    return text + "." + _above(result)


def _pairs(count: int) -> str:
    return "1 pair" if count == 1 else f"{count} interleaved pairs"


def async_vs_sync(result: dict[str, Any], accuracy: bool = True) -> list[str]:
    """The table of one async-vs-sync result: its step times, the roles' times and the speed-ups."""
    lines = [
        f"| {_pairs(len(result['pairs']))}, median (min-max) | sync | async |",
        "|---|---|---|",
        f"| run s/step (evaluations included) | {_both(result, 'run_s_per_step')} |",
        f"| RL s/step (steps no evaluation slowed) | {_both(result, 's_per_step')} |",
        f"| evaluation wall s/step | {_both(result, 'eval_s_per_step')} |",
        f"| role s/step | {_sync_phases(result)} (taking turns) | busy: {_async_roles(result, 'busy_s_per_step', 3)} |",
        f"| idle fraction | | {_async_roles(result, 'idle_fraction', 2)} |",
        f"| alone at 1 thread, s/step (for the bound) | generate {_solo(result, 'generate')}, train "
        f"{_solo(result, 'train')} | |",
    ]
    if accuracy:
        seeds = ", ".join(str(p["seed"]) for p in result["pairs"])

        def held_out(mode: str) -> str:
            return ", ".join(
                f"{p[mode]['initial_accuracy']:.3f} -> {p[mode]['final_accuracy']:.3f}" for p in result["pairs"]
            )

        lines.append(f"| held-out accuracy, seeds {seeds} | {held_out('sync')} | {held_out('async')} |")
    return [*lines, "", _summary(result)]


def demo() -> list[str]:
    """docs/benchmarks.md: the demo, `configs/tiny.yaml`."""
    return async_vs_sync(load("async_vs_sync_demo.json"))


def smollm2_vllm() -> list[str]:
    """docs/engines.md: SmolLM2's bench shape with vLLM generators (it measures speed, not learning)."""
    return async_vs_sync(load("async_vs_sync_smollm2_vllm.json"), accuracy=False)


def own_model() -> list[str]:
    """docs/own-model.md: the worked example, the default run against --mode sync (it measures speed)."""
    return async_vs_sync(load("async_vs_sync_own_model.json"), accuracy=False)


def calculator_demos() -> list[str]:
    """docs/environments.md's table: the calculator environment against the calculator agent."""
    runs = {
        name: load(f"async_vs_sync_{source}.json")
        for name, source in (("environment", "calculator"), ("agent", "calculator_agent"))
    }
    env = runs["environment"]
    warm = ", ".join(f"{pair['sync']['initial_accuracy']:.3f}" for pair in env["pairs"])

    def row(what: str, result: dict[str, Any], key: str, unit: str = "") -> str:
        cells = " | ".join(spread(per_pair(result, mode, key), 3, unit) for mode in ("sync", "async"))
        return f"| {what} | {cells} |"

    lines = [
        f"| held-out accuracy (200 pairs), median (min-max) of seeds "
        f"{', '.join(str(p['seed']) for p in env['pairs'])} | sync | async |",
        "|---|---|---|",
        row(f"after warm start, both (the same in every seed: {warm})", env, "initial_accuracy"),
        *(row(f"after RL, the calculator {name}", result, "final_accuracy") for name, result in runs.items()),
        *(
            row(f"run wall time per step, evaluations included: {name}", result, "run_s_per_step", " s")
            for name, result in runs.items()
        ),
        "",
    ]
    for name, result in runs.items():
        lines += [""] if lines[-1] else []
        lines.append(
            f"The {name}: speed-up **{spread(result['speedup'])}** in run wall time per step; RL steps alone "
            f"{spread(result['rl_speedup'])}, bound {rounded(result['rl_bound'])}, efficiency "
            f"{rounded(result['rl_efficiency'])}.{_above(result)}"
        )
    return lines


def smollm2_calculator_agent() -> list[str]:
    """docs/environments.md: the calculator agent on SmolLM2 in the Hermes format (it measures
    learning: held-out accuracy after the warm start and after RL, and the time to the target)."""
    result = load("async_vs_sync_smollm2_calculator_agent.json")
    target = result["target_accuracy"]

    def reached(mode: str) -> str:
        return ", ".join(
            "not reached" if p[mode]["s_to_target"] is None else f"{p[mode]['s_to_target']:.0f} s"
            for p in result["pairs"]
        )

    return [
        *async_vs_sync(result)[:-2],
        f"| wall time to held-out accuracy {target} | {reached('sync')} | {reached('async')} |",
        "",
        _summary(result),
    ]
