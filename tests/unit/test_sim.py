"""The simulator against cases worked out by hand: fixed durations, where a sync step is the sum
of its phases and an async step the slower role plus its weight-sync cost, and the staleness
bound, which no simulated group may exceed."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
from pathlib import Path

import pytest

from llamarl.bench.profile import line
from llamarl.config import parse_config
from llamarl.sim.costs import Costs, Lengths, ThreadCosts
from llamarl.sim.cpu import Cpu
from llamarl.sim.predict import layout_of, predict, recommend, sweep, trainer_share
from llamarl.sim.rl import Layout, simulate_async, simulate_sync, trained_tokens
from llamarl.sim.running import RunningBatch

LENGTH = 10
FIXED = Lengths(longest=LENGTH, median=LENGTH)


def costs(
    decode_s: float,
    train_s: float,
    score_s: float = 0.01,
    stage_s: float = 0.02,
    pull_s: float = 0.03,
    corun: float = 1.0,
) -> Costs:
    """Durations that do not depend on the batch or the tokens: each phase takes a fixed time."""
    at = ThreadCosts(decode_s=decode_s, decode_s_per_seq=0.0, train_s=train_s, train_s_per_token=0.0)
    return Costs(
        threads={1: at, 2: at},
        score_s_per_group=score_s,
        stage_s=stage_s,
        pull_s=pull_s,
        prompt_tokens=5.0,
        corun_slowdown={"generate": corun, "train": corun},
        cores=8,
    )


def layout(max_staleness: int = 1, generators: int = 1, cores: int = 8) -> Layout:
    return Layout(
        cores=cores,
        num_generators=generators,
        generator_threads=1,
        trainer_threads=1,
        num_reward=1,
        max_staleness=max_staleness,
        prompts_per_step=4,
        prompts_per_batch=2,
        num_samples=8,
    )


def test_a_sync_step_is_generation_plus_scoring_plus_training() -> None:
    cost = costs(decode_s=0.01, train_s=0.5)
    predicted = simulate_sync(layout(), cost, FIXED, steps=20)
    generate = LENGTH * 0.01  # the step's four prompts in one batch, as the sync run decodes
    assert predicted.s_per_step == pytest.approx(generate + 4 * 0.01 + 0.5)
    assert predicted.staleness == {0: 80}


@pytest.mark.parametrize(("decode_s", "train_s"), [(0.05, 0.3), (0.01, 0.7)])
def test_an_async_step_is_the_slower_role_plus_its_weight_sync(decode_s: float, train_s: float) -> None:
    cost = costs(decode_s=decode_s, train_s=train_s)
    predicted = simulate_async(layout(), cost, FIXED, steps=40)
    generator = 2 * LENGTH * decode_s + cost.pull_s  # two batches, one new version a step
    trainer = train_s + cost.stage_s
    assert predicted.s_per_step == pytest.approx(max(generator, trainer), rel=1e-6)
    slower = "generator" if generator > trainer else "trainer"
    assert predicted.idle_fraction[slower] < 0.02
    other = "trainer" if slower == "generator" else "generator"
    assert predicted.idle_fraction[other] == pytest.approx(
        1 - min(generator, trainer) / max(generator, trainer), abs=0.02
    )


def test_without_lag_async_takes_turns_like_sync_plus_its_sync_costs() -> None:
    cost = costs(decode_s=0.02, train_s=0.4)
    predicted = simulate_async(layout(max_staleness=0), cost, FIXED, steps=30)
    # The step's tickets open when the last step is trained: pull, two batches, the last
    # batch's two groups scored, then train and stage.
    turn = cost.pull_s + 2 * LENGTH * 0.02 + 2 * 0.01 + 0.4 + cost.stage_s
    assert predicted.s_per_step == pytest.approx(turn, rel=1e-6)
    assert predicted.staleness == {0: 120}


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
@pytest.mark.parametrize("generators", [1, 2, 4])
def test_no_group_is_trained_staler_than_the_bound(max_staleness: int, generators: int) -> None:
    cost = costs(decode_s=0.01, train_s=0.1, corun=1.2)
    tail = Lengths(longest=64, median=12, sigma=1.0)
    predicted = simulate_async(layout(max_staleness, generators, cores=2), cost, tail, steps=60)
    assert max(predicted.staleness) <= max_staleness
    assert sum(predicted.staleness.values()) == 60 * 4, "every step trained a full batch"


def test_busy_processes_beyond_the_cores_share_them() -> None:
    cpu = Cpu(cores=1, corun_slowdown={"generate": 1.5})
    finished: list[tuple[str, float]] = []
    cpu.start("a", "train", 1, 1.0, lambda: finished.append(("a", cpu.now)))
    cpu.start("b", "generate", 1, 0.5, lambda: finished.append(("b", cpu.now)))
    while cpu.advance():
        pass
    # Together each gets half the core; b also pays its co-run slowdown (1.5): b's 0.5 s of
    # work takes 0.5 * 2 * 1.5 = 1.5 s, in which a did 0.75 s of its 1.0; a finishes alone.
    assert finished == [("b", pytest.approx(1.5)), ("a", pytest.approx(1.75))]


def test_the_profile_solves_its_cost_lines_through_two_timed_sizes() -> None:
    truth = ThreadCosts(decode_s=0.002, decode_s_per_seq=0.0005, train_s=0.1, train_s_per_token=0.001)
    decode = line((8, 16), (truth.generate_s(8, 1), truth.generate_s(16, 1)))
    assert decode == pytest.approx((truth.decode_s, truth.decode_s_per_seq))
    train = line((200, 400), (truth.step_train_s(200), truth.step_train_s(400)))
    assert train == pytest.approx((truth.train_s, truth.train_s_per_token))
    # Growing faster than linearly: the line goes through the larger, the configured, size.
    steep = line((200, 400), (0.3, 0.9))
    assert steep[0] == 0 and 400 * steep[1] == pytest.approx(0.9)
    # The larger size cheaper (noise on a flat cost): flat at the configured size, so a batch
    # whose rows end early still pays each position it decodes.
    assert line((32, 64), (0.0071, 0.0068)) == (0.0068, 0.0)


def test_a_sync_run_pays_its_measured_generation_slowdown() -> None:
    cost = dataclasses.replace(costs(decode_s=0.01, train_s=0.5), sync_generate_slowdown=1.5)
    predicted = simulate_sync(layout(), cost, FIXED, steps=20)
    assert predicted.s_per_step == pytest.approx(LENGTH * 0.01 * 1.5 + 4 * 0.01 + 0.5)


def test_sim_refuses_a_missing_or_malformed_profile_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workers.cli import main

    tiny = str(Path(__file__).parents[2] / "configs" / "tiny.yaml")
    for args, message in (
        ([tiny], "--profile: give the file"),
        ([tiny, "--profile", tiny], "not a profile"),
        ([], "give a run config"),
        ([tiny, "--paper"], "--paper takes no config"),
    ):
        assert main(["sim", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_saved_profile_loads_back_and_predicts_both_modes(tmp_path: Path) -> None:
    cost = costs(decode_s=0.01, train_s=0.3)
    cost.save(tmp_path / "profile.json", {"config": "x"})
    loaded = Costs.load(tmp_path / "profile.json")
    assert loaded == cost
    result = predict(layout(), loaded, FIXED, steps=30)
    assert result["sync"]["s_per_step"] > result["async"]["s_per_step"] > 0
    assert result["speedup"] == pytest.approx(result["sync"]["s_per_step"] / result["async"]["s_per_step"], rel=1e-2)


def test_oversubscribed_cores_cost_the_measured_extra_and_durations_vary_around_their_mean() -> None:
    cpu = Cpu(cores=1, corun_slowdown={}, oversubscribed_slowdown=1.2)
    finished: list[float] = []
    for name in ("a", "b"):
        cpu.start(name, "generate", 1, 1.0, lambda: finished.append(cpu.now))
    while cpu.advance():
        pass
    assert finished == [pytest.approx(2.4), pytest.approx(2.4)]  # 1 s each at half of 1/1.2
    varied = costs(0.01, 0.1)
    varied = Costs(**{**varied.__dict__, "jitter_cv": {"train": 0.1}})
    rng = random.Random(0)
    draws = [varied.jittered(rng, "train", 2.0) for _ in range(20_000)]
    assert statistics.mean(draws) == pytest.approx(2.0, rel=0.01)
    assert statistics.stdev(draws) / 2.0 == pytest.approx(0.1, rel=0.05)
    assert varied.jittered(rng, "generate", 2.0) == 2.0, "no spread measured: no spread drawn"


def test_the_simulated_layout_splits_spare_cores_by_the_profiled_work_share() -> None:
    config = parse_config(
        {
            "generation": {"num_samples": 8, "max_new_tokens": 10, "prompts_per_batch": 2},
            "trainer": {"prompts_per_step": 4},
        }
    )
    # Generation: 2 batches x 10 positions x 0.01 s = 0.2 s; training 0.6 s: a 0.75 share.
    cost = costs(decode_s=0.01, train_s=0.6)
    assert trainer_share(config, cost) == pytest.approx(0.75)
    split = layout_of(config, 8, cost)
    assert (split.trainer_threads, split.generator_threads) == (6, 2)
    assert layout_of(config, 2, cost).trainer_threads == 1, "too few cores: a thread each"


def test_the_sweep_recommends_the_cheapest_of_the_layouts_tied_with_the_fastest() -> None:
    """Generation-bound on 2 cores: one generator leaves a core to a mostly idle trainer, two or
    more fill both cores and tie; the recommendation is the tie with fewest processes and the
    lowest staleness bound that keeps the speed (0 makes the roles take turns)."""
    cost = costs(decode_s=0.05, train_s=0.2, stage_s=0.0, pull_s=0.0)
    result = sweep(layout(cores=2), cost, FIXED, steps=60, cores=2)
    rows = {
        (r["num_generators"], r["max_staleness"]): r["s_per_step"]
        for r in result["layouts"]
        if (r["trainer_threads"], r["generator_threads"], r["colocated"]) == (1, 1, False)
    }
    one, two, three = rows[(1, 1)], rows[(2, 1)], rows[(3, 1)]
    assert one == pytest.approx(2 * LENGTH * 0.05, rel=0.01), "one generator: its batches"
    assert two < one * 0.8 and three == pytest.approx(two, rel=result["tie"])
    assert rows[(2, 0)] > two * (1 + result["tie"]), "no lag: the roles take turns"
    best = result["best"]
    assert (best["num_generators"], best["max_staleness"]) == (2, 1)
    assert result["best_speedup"] == pytest.approx(result["sync_s_per_step"] / best["s_per_step"], rel=1e-3)


def test_paper_mode_steps_are_their_phases_and_the_speedup_grows_with_scale(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the same simulator: a sync step is generation + training + the weight handover,
    an async step the slower role plus its DDMA transfer; LlamaRL's trend (the speed-up grows
    from 8B to 70B to 405B) follows from the stated assumptions."""
    from llamarl.sim import paper
    from workers.cli import main

    assert main(["sim", "--paper"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {row["model"]: row for row in result["scales"]}
    assert list(rows) == ["8B", "70B", "405B"]
    tokens = (
        paper.ASSUMED["prompts_per_step"]
        * paper.ASSUMED["samples_per_prompt"]
        * (paper.ASSUMED["prompt_tokens"] + paper.ASSUMED["completion_tokens"])
    )
    for scale, row in rows.items():
        cost = paper.costs_at(scale)
        positions = paper.ASSUMED["completion_tokens"]
        generate = {t: cost.at(t).decode_s * positions for t in (1, 2)}
        train = {t: cost.at(t).train_s_per_token * tokens for t in (1, 2)}
        assert row["sync_s_per_step"] == pytest.approx(generate[2] + train[2] + cost.handover_s, abs=0.01)
        assert row["async_s_per_step"] == pytest.approx(
            max(generate[1] + cost.pull_s, train[1] + cost.stage_s), abs=0.01
        )
    # By hand at 8B on 64 GPUs: generation 1024 positions x (16.06 GB of bf16 weights + 32
    # sequences x 134 MB of KV cache) / (0.6 x 3.35 TB/s) = 10.37 s; training 6 x 8.03e9 x
    # 2048 x 1536 tokens / (64 x 989e12 x 0.4) = 5.99 s; handover 16.06 GB / 1.265 GB/s = 12.70 s.
    assert rows["8B"]["sync_s_per_step"] == pytest.approx(10.37 + 5.99 + 12.70, abs=0.03)
    assert rows["405B"]["paper_sync_s_per_step"] == 635.8
    speedups = [row["speedup"] for row in rows.values()]
    assert 1 < speedups[0] < speedups[1] < speedups[2]


def test_a_tie_goes_to_fewer_processes_then_threads_then_less_staleness() -> None:
    def row(generators: int, threads: int, staleness: int, s_per_step: float) -> dict[str, float]:
        return {
            "num_generators": generators,
            "generator_threads": threads,
            "colocated": False,
            "trainer_threads": 1,
            "max_staleness": staleness,
            "s_per_step": s_per_step,
        }

    rows = [
        row(3, 1, 2, 0.600),
        row(2, 2, 1, 0.608),
        row(2, 1, 4, 0.612),
        row(2, 1, 2, 0.615),
        row(2, 1, 0, 0.700),
        row(1, 1, 1, 0.900),
    ]
    assert recommend(rows, tie=0.03) == rows[3], "2 x 1 thread, the lower bound of the ties"
    assert recommend(rows, tie=0.015) == rows[1], "2.5% slower is no longer a tie"
    assert recommend(rows, tie=0.0) == rows[0], "no tolerance: the fastest"


def test_a_colocated_step_is_the_sync_step_plus_staging_and_pulling_its_version() -> None:
    cost = dataclasses.replace(costs(decode_s=0.01, train_s=0.5), sync_generate_slowdown=1.5)
    colocated = simulate_sync(dataclasses.replace(layout(), colocated=True), cost, FIXED, 20)
    # Its generator is a process of its own: no sync-process slowdown on decoding.
    assert colocated.s_per_step == pytest.approx(LENGTH * 0.01 + 4 * 0.01 + 0.5 + cost.stage_s + cost.pull_s)
    assert colocated.mode == "colocated"


def test_a_running_batch_frees_a_place_per_n_ended_rows_and_ends_a_group_with_its_last_row() -> None:
    batch = RunningBatch(num_samples=2)
    batch.admit(ticket=0, version=0, lengths=[1, 3])
    batch.admit(ticket=1, version=0, lengths=[1, 2])
    assert (batch.rows(), batch.free_groups(2)) == (4, 0)
    assert batch.step() == [], "each group has a row still running"
    assert (batch.rows(), batch.free_groups(2)) == (2, 1), "two rows ended: one group's place"
    assert [g.ticket for g in batch.step()] == [1]
    batch.admit(ticket=2, version=1, lengths=[2, 2])
    assert batch.restart_older_than(floor=1, version=2) == 1, "ticket 0 is below the floor"
    assert [(g.ticket, g.version, g.decoded) for g in batch.groups] == [(0, 2, 0), (2, 1, 0)]


@pytest.mark.parametrize(
    ("widths", "max_tokens", "tokens"),
    [([3, 10], 1000, 2 * 2 * (5 + 10)), ([10, 3], 30, 2 * (5 + 3) + 2 * (5 + 10))],
)
def test_a_training_step_is_charged_its_micro_batches_padded_to_their_longest(
    widths: list[int], max_tokens: int, tokens: int
) -> None:
    assert trained_tokens(widths, rows=2, prompt=5.0, max_tokens=max_tokens) == tokens


def test_continuous_batching_refills_the_places_short_completions_free() -> None:
    """Generation-bound, a long completion in one group of four: a static batch waits for it
    with every row in it; a running batch refills the places the short ones free, so its
    generator (and so the step) is faster, and no group is staler than the bound."""
    at = ThreadCosts(decode_s=0.01, decode_s_per_seq=0.001, train_s=0.01, train_s_per_token=0.0)
    cost = dataclasses.replace(costs(0.01, 0.01), threads={1: at, 2: at})
    tail = Lengths(longest=40, median=40, observed=(2, 2, 2, 40))
    static = simulate_async(layout(max_staleness=2), cost, tail, steps=40)
    running = simulate_async(dataclasses.replace(layout(max_staleness=2), continuous=True), cost, tail, steps=40)
    assert running.s_per_step < 0.8 * static.s_per_step
    assert max(running.staleness) <= 2
    assert sum(running.staleness.values()) == 40 * 4


@pytest.mark.parametrize("inflight_updates", [True, False])
def test_with_fixed_lengths_a_running_batch_costs_what_a_static_one_does(
    inflight_updates: bool,
) -> None:
    cost = costs(decode_s=0.05, train_s=0.3)
    running = dataclasses.replace(layout(), continuous=True, inflight_updates=inflight_updates)
    predicted = simulate_async(running, cost, FIXED, steps=40)
    assert predicted.s_per_step == pytest.approx(2 * LENGTH * 0.05 + cost.pull_s, rel=1e-6)


def test_the_sweep_gives_a_training_heavy_config_every_core_for_training() -> None:
    """Training-heavy on 2 cores, training 1.9x faster on both cores than on one: a split that
    gives the trainer one thread waits on a trainer slower than the whole sync step; the sweep's
    choice trains on both cores (colocated, or a trainer with more threads than cores of its own)
    and is predicted within 3% of sync."""
    one = ThreadCosts(decode_s=0.002, decode_s_per_seq=0.0, train_s=1.0, train_s_per_token=0.0)
    two = ThreadCosts(decode_s=0.0012, decode_s_per_seq=0.0, train_s=0.52, train_s_per_token=0.0)
    cost = dataclasses.replace(
        costs(0.0, 0.0, stage_s=0.001, pull_s=0.001, corun=1.1), threads={1: one, 2: two}, oversubscribed_slowdown=1.2
    )
    result = sweep(layout(cores=2), cost, FIXED, steps=40, cores=2, max_staleness=1)
    rows = result["layouts"]
    one_thread = [r["s_per_step"] for r in rows if r["trainer_threads"] == 1]
    assert min(one_thread) > 1.7 * result["sync_s_per_step"]
    (colocated,) = [r for r in rows if r["colocated"]]
    assert colocated["s_per_step"] == pytest.approx(result["sync_s_per_step"] + 0.002, rel=1e-3)
    assert result["best"]["trainer_threads"] == 2
    assert result["best"]["s_per_step"] <= result["sync_s_per_step"] * 1.03
    assert {r["max_staleness"] for r in rows} == {0, 1}, "never above the user's bound"


def test_a_tie_between_taking_turns_and_a_split_goes_to_the_split() -> None:
    """Auto starts what `recommend` picks: colocated only when it is predicted faster than every
    split beyond the tie (a split measured faster than colocated on every shape of the grid)."""

    def row(colocated: bool, s_per_step: float) -> dict[str, float]:
        threads = 2 if colocated else 1
        return {
            "num_generators": 1,
            "generator_threads": threads,
            "colocated": colocated,
            "trainer_threads": threads,
            "max_staleness": 0 if colocated else 1,
            "s_per_step": s_per_step,
        }

    turns, split = row(True, 0.1997), row(False, 0.2005)
    assert recommend([turns, split], tie=0.03) is split
    faster_turns = row(True, 0.150)
    assert recommend([faster_turns, split], tie=0.03) is faster_turns
