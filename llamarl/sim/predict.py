"""What `llamarl sim` answers: the layout a config describes, its sync and async predictions, and
the sweep over core splits and staleness bounds. The split of the cores by training's share of the
work (`split_cores`) is the launcher's too: `llamarl run` applies it to a share it measures
(`llamarl.launch.cores`), the simulator to one from the profile."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from llamarl.config import RunConfig
from llamarl.sim.costs import Costs, Lengths
from llamarl.sim.rl import Layout, Prediction, simulate_async, simulate_sync, speedup

SWEEP_STALENESS = (0, 1, 2, 4)


def split_cores(num_cores: int, num_generators: int, trainer_share: float) -> tuple[int, int]:
    """(trainer threads, threads per generator) for a trainer share of the work: in proportion,
    at least one thread a process."""
    trainer = round(num_cores * trainer_share)
    trainer = max(1, min(trainer, num_cores - num_generators))
    return trainer, max(1, (num_cores - trainer) // num_generators)


def trainer_share(config: RunConfig, costs: Costs) -> float:
    """Training's share of a step's work at one thread, from the profile (what the launcher
    measures at start to split the cores)."""
    at = costs.at(1)
    gen = config.generation
    batches = config.trainer.prompts_per_step / gen.prompts_per_batch
    generate = batches * at.generate_s(gen.prompts_per_batch * gen.num_samples, gen.max_new_tokens)
    tokens = config.trainer.prompts_per_step * gen.num_samples * gen.max_new_tokens
    train = at.step_train_s(tokens)
    return train / (train + generate)


def layout_of(config: RunConfig, cores: int, costs: Costs) -> Layout:
    """The layout `llamarl run` would start for `config` on `cores` cores: one thread a process
    when they do not fit, else the split by the work's share (or the config's thread counts)."""
    workers, generators = config.workers, config.workers.num_generators
    trainer, generator = 1, 1
    if cores > generators + 1:
        trainer, generator = split_cores(cores, generators, trainer_share(config, costs))
    return Layout(
        cores=cores,
        num_generators=generators,
        generator_threads=workers.generator_threads or generator,
        trainer_threads=workers.trainer_threads or trainer,
        num_reward=workers.num_reward,
        max_staleness=config.staleness.max_staleness,
        prompts_per_step=config.trainer.prompts_per_step,
        prompts_per_batch=config.generation.prompts_per_batch,
        num_samples=config.generation.num_samples,
        continuous=config.generation.batching == "continuous" and config.environment.kind is None,
        inflight_updates=config.generation.inflight_updates,
        micro_batch_tokens=config.trainer.micro_batch_tokens,
    )


def lengths_of(config: RunConfig, median: float | None, sigma: float, observed: Sequence[int] = ()) -> Lengths:
    """Completion lengths: every one max_new_tokens long when EOS is banned before the last
    position; else log-normal with the given median and sigma, or (neither given) the lengths
    the profile's model sampled, or all max_new_tokens long."""
    longest = config.generation.max_new_tokens
    if config.generation.min_new_tokens >= longest - 1:
        return Lengths(longest, longest)
    if median is None and sigma == 0 and observed:
        return Lengths(longest, longest, observed=tuple(observed))
    return Lengths(longest, median or longest, sigma)


def predict(layout: Layout, costs: Costs, lengths: Lengths, steps: int) -> dict[str, Any]:
    sync = simulate_sync(layout, costs, lengths, steps)
    asynchronous = simulate_async(layout, costs, lengths, steps)
    return {
        "layout": layout.__dict__,
        "sync": sync.as_dict(),
        "async": asynchronous.as_dict(),
        "speedup": round(speedup(sync, asynchronous), 3),
    }


def candidates(base: Layout, cores: int, max_staleness: int = max(SWEEP_STALENESS)) -> list[Layout]:
    """Every split of `cores` between the trainer and 1..cores+1 generators (threads a process
    at least one; more threads than cores share them: the trainer may take every core, as it
    does while the generators wait), at each staleness bound up to `max_staleness`; and the
    colocated layout (generation and training in turn on every core)."""
    layouts = []
    bounds = [b for b in SWEEP_STALENESS if b < max_staleness] + [max_staleness]
    for generators in range(1, cores + 2):
        for trainer in range(1, cores + 1):
            for per_generator in range(1, max(1, (cores - 1) // generators) + 1):
                for bound in bounds:
                    layouts.append(
                        replace(
                            base,
                            cores=cores,
                            num_generators=generators,
                            generator_threads=per_generator,
                            trainer_threads=trainer,
                            max_staleness=bound,
                            colocated=False,
                        )
                    )
    layouts.append(
        replace(
            base,
            cores=cores,
            num_generators=1,
            generator_threads=cores,
            trainer_threads=cores,
            max_staleness=0,
            colocated=True,
        )
    )
    return layouts


TIE = 0.03
"""Layouts predicted within this fraction of the fastest are ties: closer than the simulator's
errors against measured runs can tell apart."""


def cost_of(row: dict[str, Any]) -> tuple[int, int, int, int]:
    """What a tie is settled by: overlap first (a split layout keeps both roles busy where the
    prediction cannot tell them apart), then fewer processes (memory, weight syncs), fewer
    threads, and a lower staleness bound (updates closer to on-policy)."""
    threads = row["num_generators"] * row["generator_threads"] + row["trainer_threads"]
    return int(row["colocated"]), row["num_generators"], threads, row["max_staleness"]


def recommend(rows: list[dict[str, Any]], tie: float) -> dict[str, Any]:
    """The cheapest of the rows within `tie` of the fastest one's s/step."""
    fastest = min(r["s_per_step"] for r in rows)
    return min((r for r in rows if r["s_per_step"] <= fastest * (1 + tie)), key=cost_of)


def simulate(layout: Layout, costs: Costs, lengths: Lengths, steps: int) -> Prediction:
    """A layout's predicted run: colocated in turn, else side by side."""
    if layout.colocated:
        return simulate_sync(layout, costs, lengths, steps)
    return simulate_async(layout, costs, lengths, steps)


def sweep(
    base: Layout,
    costs: Costs,
    lengths: Lengths,
    steps: int,
    cores: int,
    tie: float = TIE,
    max_staleness: int = max(SWEEP_STALENESS),
) -> dict[str, Any]:
    """Predicted s/step of every candidate layout, fastest first, against the sync run. The
    recommendation (`best`) is the cheapest layout within `tie` of the fastest."""
    rows = []
    for layout in candidates(base, cores, max_staleness):
        predicted = simulate(layout, costs, lengths, steps)
        rows.append(
            {
                "num_generators": layout.num_generators,
                "generator_threads": layout.generator_threads,
                "trainer_threads": layout.trainer_threads,
                "max_staleness": layout.max_staleness,
                "colocated": layout.colocated,
                "s_per_step": round(predicted.s_per_step, 4),
                "idle_fraction": {k: round(v, 3) for k, v in predicted.idle_fraction.items()},
            }
        )
    rows.sort(key=lambda r: (r["s_per_step"], *cost_of(r)))
    sync = simulate_sync(base, costs, lengths, steps).s_per_step
    best = recommend(rows, tie)
    return {
        "cores": cores,
        "sync_s_per_step": round(sync, 4),
        "best": best,
        "best_speedup": round(sync / best["s_per_step"], 3),
        "tie": tie,
        "layouts": rows,
    }
