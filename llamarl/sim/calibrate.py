"""The profile's cost lines scaled to the one run the profile made of the config's own steps.

The lines (`llamarl.sim.costs.ThreadCosts`) are fitted on short probes: a batch decoded a few
positions, a training step on two sizes. The profile's turns probe (`llamarl.bench.turns_probe`)
then runs the config's real steps in one process on every core and times their generation and
training. Where the two disagree, the probes missed something the real step pays (its sampler's
bookkeeping, its lengths, the machine's speed that minute), so every thread count's decode costs
are scaled by measured / predicted generation, and its training costs by measured / predicted
training, the prediction being the simulator's own lock-step run on every core.

Checked on the grid's four small shapes (`llamarl bench grid`, 3 rounds, 2-core cloud machine),
each round's split calibrated to that round's sync run: the split's median prediction error went
from -8% to +10% (demo), -35% to -8% (generation_heavy), +21% to 0% (train_heavy) and -27% to
-33% (variable_length, whose split pays hand-over waits the simulator does not model); the
lock-step run's from -41%..+41% to within 5%.
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
    """`costs` with each thread count's decode and training lines scaled (`scales`), and the
    scales."""
    found = scales(costs, layout, lengths, steps)
    decode, train = found["generate"], found["train"]
    threads = {
        count: ThreadCosts(
            decode_s=line.decode_s * decode,
            decode_s_per_seq=line.decode_s_per_seq * decode,
            train_s=line.train_s * train,
            train_s_per_token=line.train_s_per_token * train,
        )
        for count, line in costs.threads.items()
    }
    return replace(costs, threads=threads), found
