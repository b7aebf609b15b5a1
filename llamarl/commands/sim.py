"""`llamarl sim CONFIG --profile FILE`: sync and async predictions for the config's layout, or
(`--sweep`) every split of the cores and staleness bound, fastest first; (`--paper`) the LlamaRL
scale points from public assumptions. JSON on the last stdout line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llamarl.commands.base import Subparsers
from llamarl.config import load_config


def register(sub: Subparsers) -> None:
    sim = sub.add_parser("sim", help="predict sync/async step time, idle and staleness")
    sim.add_argument("config", nargs="?", help="run config YAML (layout, batch sizes, staleness)")
    sim.add_argument("overrides", nargs="*", help="section.field=value overrides")
    sim.add_argument("--profile", help="from `llamarl bench profile` (not needed with --paper)")
    sim.add_argument("--steps", type=int, default=200, help="simulated RL steps")
    sim.add_argument("--cores", type=int, help="cores to lay out (default: the profile's)")
    sim.add_argument("--median-length", type=float, help="completion tokens, median")
    sim.add_argument("--length-sigma", type=float, default=0.0, help="log-normal sigma (tail)")
    sim.add_argument("--sweep", action="store_true", help="every core split and staleness bound")
    sim.add_argument(
        "--paper", action="store_true", help="LlamaRL's 8B/70B/405B points from public figures (no config)"
    )
    sim.add_argument("--json", action="store_true", help="accepted; the last line is JSON anyway")
    sim.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llamarl.errors import ConfigError

    if args.paper:
        from llamarl.sim.paper import paper

        if args.config or args.profile or args.sweep:
            raise ConfigError("--paper takes no config, --profile or --sweep: its inputs are fixed")
        print(json.dumps(paper(args.steps)), flush=True)
        return 0
    if args.config is None:
        raise ConfigError("give a run config (llamarl sim CONFIG --profile FILE), or --paper")
    if args.profile is None:
        raise ConfigError("--profile: give the file `llamarl bench profile CONFIG --out FILE` wrote")
    from llamarl.sim.calibrate import calibrated
    from llamarl.sim.costs import Costs
    from llamarl.sim.predict import layout_of, lengths_of, predict, sweep

    config = load_config(args.config)
    costs = Costs.load(Path(args.profile))
    cores = args.cores or config.workers.num_cores or costs.cores
    lengths = lengths_of(config, args.median_length, args.length_sigma)
    # Calibrated where the turns probe ran: on the profiled machine's cores.
    costs, _ = calibrated(costs, layout_of(config, costs.cores, costs), lengths, args.steps)
    layout = layout_of(config, cores, costs)
    if args.sweep:
        result = sweep(layout, costs, lengths, args.steps, cores)
    else:
        result = predict(layout, costs, lengths, args.steps)
    print(json.dumps(result), flush=True)
    return 0
