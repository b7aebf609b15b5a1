"""The profile's cost lines scaled to the one run the profile made of the config's own steps.

The lines (`llamarl.sim.costs.ThreadCosts`) are fitted on short probes: a batch decoded a few
positions, a training step on two sizes. The profile's turns probe (`llamarl.bench.turns_probe`)
then runs the config's real steps in one process on every core and times their generation and
training. Where the two disagree, the probes missed something the real step pays (its sampler's
bookkeeping, its lengths, the machine's speed that minute), so the decode costs are scaled by
measured / predicted generation, and the training costs by measured / predicted training, the
prediction being the simulator's own lock-step run on every core. That run measured the
every-core lines only: the lines of fewer threads take a scale only where it makes them dearer.

Checked on the grid's four small shapes (`llamarl bench grid`, 3 rounds, 2-core cloud machine),
each round's split calibrated to that round's sync run: the split's median prediction error went
from -8% to +10% (demo), -35% to -8% (generation_heavy), +21% to 0% (train_heavy) and -27% to
-33% (variable_length, whose split pays hand-over waits the simulator does not model); the
lock-step run's from -41%..+41% to within 5%. With fewer threads' lines no longer made cheaper
(checked offline on profiles measured 2026-12-07): on fresh profiles of five of the grid's
shapes, auto now takes turns on both training-heavy ones, whose splits had measured 0.96x and
0.92x sync, and keeps its splits on demo, generation_heavy and variable_length; on the profiles
of the grid run with alternating arms, the SmolLM2 training-heavy split is predicted 3.33 s a
step instead of 2.48 (it ran 4.26; auto now takes turns) and the small training-heavy one 0.256
instead of 0.231 (it ran 0.294, 1.07x sync; auto keeps it).
"""

from __future__ import annotations

from dataclasses import replace

from llamarl.sim.costs import Costs, Lengths, ThreadCosts
from llamarl.sim.rl import Layout, simulate_sync

SCALE_LIMITS = (0.25, 4.0)
"""A scale outside these is a probe gone wrong, not a calibration: it is held at the limit."""


def scales(costs: Costs, layout: Layout, lengths: Lengths, steps: int) -> dict[str, float]:
    """Per phase (generate, train): the turns probe's median seconds a step over the simulator's
    lock-step prediction for `layout` on every core; 1.0 where either is missing."""
    measured = costs.turns_phase_s
    if not measured:
        return {"generate": 1.0, "train": 1.0}
    lockstep = replace(layout, colocated=False)
    sync = simulate_sync(lockstep, costs, lengths, steps)
    low, high = SCALE_LIMITS
    found = {}
    for phase in ("generate", "train"):
        predicted = sync.s_per_step * (1 - sync.idle_fraction[phase])
        ratio = measured.get(phase, 0.0) / predicted if predicted > 0 else 0.0
        found[phase] = round(min(high, max(low, ratio)), 4) if ratio > 0 else 1.0
    return found


def calibrated(costs: Costs, layout: Layout, lengths: Lengths, steps: int) -> tuple[Costs, dict[str, float]]:
    """`costs` with the decode and training lines scaled (`scales`), and the scales. The turns
    probe ran on every core: that thread count's lines take the scales as they are, the others'
    only where a scale makes them dearer. A probe's line at fewer threads is not made cheaper by
    a run on every core (on bench_smollm2_train_heavy the training scale was 0.70, and a
    one-thread trainer so scaled was predicted at 2.48 s a step and ran 4.6)."""
    found = scales(costs, layout, lengths, steps)
    every_core = max(costs.threads, default=0)
    threads = {}
    for count, line in costs.threads.items():
        decode, train = found["generate"], found["train"]
        if count != every_core:
            decode, train = max(1.0, decode), max(1.0, train)
        threads[count] = ThreadCosts(
            decode_s=line.decode_s * decode,
            decode_s_per_seq=line.decode_s_per_seq * decode,
            train_s=line.train_s * train,
            train_s_per_token=line.train_s_per_token * train,
        )
    return replace(costs, threads=threads), found
