"""`llamarl bench profile CONFIG`: what each role's work costs on this machine, for `llamarl sim`
and `workers.layout: auto`, measured in one process in well under a minute for the demo.

The model is built (or loaded) once. For each thread count from 1 to the machine's cores: up to
16 decode positions at two batch sizes (a generator's batch and a sync step's, or its double),
with the prompt's pass timed apart, give a batch's cost spread over its positions, fixed and per
sequence; a training step on the config's step of full-length completions and one on half its
rows give the training cost, fixed and per token. Between the first thread count and the second,
two forked copies of this process (one-threaded and warm so far; `bench.corun`, each warmed once
and reused) measure how roles slow each other: a generation batch repeated on one core beside a
small training step repeated on another, against each alone, and a trainer on every core beside
a one-thread generator against its fair share of the cores; the alone runs' spread from one
repeat to the next is the jitter the simulator draws.
Scoring is the config's scorer on completions sampled as the config samples, whose lengths the
simulator then draws from; staging and pulling a version is a copy of the weights each way, and
with `generation.engine: vllm` pulling adds loading them into the engine. A vLLM config's decode
costs are its engine's (the co-run probes decode natively: a forked copy cannot run the engine).
Taking turns is measured for real, engine and all: a few steps of the one_process layout in a
process of its own (`llamarl.bench.turns_probe`).

A profile is cached under `LLAMARL_CACHE_DIR` (default ~/.cache/llamarl) by the config's fields
that change these costs and by the machine (host, usable cores, CPU model, torch version); a
second call with the same key reads it back (`--fresh` measures again). Only a profile measured
on a quiet machine is kept: other processes' use of the cores meanwhile
(`llamarl.bench.machine_load`) is recorded as `others_cores`, and above BUSY_CORES it is measured
again, then refused in one line (or kept, marked busy, with LLAMARL_PROFILE_BUSY=accept). The
second measurement runs in a process of its own (`measure_apart`): the first ran torch on every
core, and a probe forked from such a process can deadlock in the OpenMP runtime it inherits.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from llamarl.bench.corun import corun
from llamarl.bench.engine_probe import EngineProbe
from llamarl.bench.machine_load import BUSY_CORES, OtherLoad, others_now
from llamarl.bench.profile_apart import measure_apart
from llamarl.bench.turns_probe import turns_s_per_step
from llamarl.config import RunConfig, parse_config
from llamarl.config.run import read_tree
from llamarl.engine.adapters import with_adapters
from llamarl.engine.grouped import TrainGroup
from llamarl.engine.model import Policy, make_policy
from llamarl.engine.rollouts import pack_groups
from llamarl.engine.sampling import sample
from llamarl.errors import ConfigError
from llamarl.launch.cores import encoded_prompts, usable_cores
from llamarl.sim.costs import Costs, ThreadCosts
from llamarl.tasks import make_prompt_set

DECODE_POSITIONS = 16
"""Decode positions timed per batch after the prompt's pass and first token (fewer when
max_new_tokens is shorter); a batch's cost is that pass plus max_new_tokens - 1 of them."""
MEASURE_ATTEMPTS = 2
"""Measurements of a profile before a machine that stays busy is refused (`trusted_measure`)."""
QUIET_CHECK_S = 2.0
"""How long an attempt watches the machine before it measures."""
RETRY_WAIT_S = 10.0
"""How long the next attempt waits for a busy machine to settle."""
CORUN_POSITIONS = 4
"""Decode positions of the co-run probes' generation unit."""
COST_SECTIONS = ("model", "task", "generation", "algorithm", "trainer", "sampling", "environment")
"""The config sections whose fields can change a role's cost (the run's length and bookkeeping
fields are dropped from the cache key below)."""
NOT_COSTS = {
    "trainer": (
        "num_steps",
        "eval_every",
        "sft_steps",
        "checkpoint_every",
        "keep_checkpoints",
        "lr",
        "sft_lr",
        "lr_schedule",
        "lr_warmup_steps",
        "lr_min_ratio",
    ),
    "task": ("num_eval",),
}


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMARL_CACHE_DIR", Path.home() / ".cache" / "llamarl"))


def machine() -> dict[str, Any]:
    cpu = ""
    if Path("/proc/cpuinfo").exists():
        names = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0].split(":", 1)[1].strip() if names else ""
    return {"host": platform.node(), "cores": usable_cores(), "cpu": cpu, "torch": torch.__version__}


def cache_key(config: RunConfig) -> str:
    """What the costs depend on: the config's cost fields and the machine."""
    tree = config.model_dump(mode="json")
    kept = {name: tree.get(name) for name in COST_SECTIONS}
    for section, fields in NOT_COSTS.items():
        kept[section] = {k: v for k, v in (kept[section] or {}).items() if k not in fields}
    text = json.dumps({"config": kept, "machine": machine()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Probes:
    """The units of work a profile times, on one model: a generation batch and a training step."""

    def __init__(self, config: RunConfig) -> None:
        from llamarl.roles.build import scorer, start_engine
        from llamarl.training.learner import Learner

        self.config = config
        gen = config.generation
        policy = make_policy(config.model, config.seed)
        self.policy: Policy = with_adapters(policy, config.model.lora, config.seed)
        self.engine = None
        """A vLLM generator's engine (generation.engine: vllm), which then decodes the
        profile's batches; the co-run probes' generator is then a vLLM engine in a process of its
        own (`llamarl.bench.engine_probe`: a forked process cannot run one)."""
        if gen.engine == "vllm":
            self.engine = start_engine(config, self.policy, config.seed)
        per_step = config.trainer.prompts_per_step
        self.batches = (
            (gen.prompts_per_batch, per_step) if gen.prompts_per_batch < per_step else (per_step, 2 * per_step)
        )
        self.prompts = encoded_prompts(config, self.policy, max(self.batches))
        self.rng = torch.Generator().manual_seed(config.seed)
        algorithm = config.algorithm.with_loss_constant(gen.max_new_tokens)
        self.learner = Learner(self.policy, algorithm, config.trainer, gen.temperature)
        self.scorer = scorer(config, nullcontext)
        self.step_groups = self.train_groups(per_step, gen.num_samples)
        self.half_groups = self.train_groups(per_step, max(1, gen.num_samples // 2))
        self.corun_groups = self.train_groups(1, min(2, gen.num_samples))
        self.warm_half = False
        """Whether a half step has run (`thread_costs` warms it once)."""

    def decode(self, prompts: int, positions: int, native: bool = False) -> Any:
        gen = self.config.generation
        decode = sample if native or self.engine is None else self.engine.sample
        return decode(
            self.policy,
            self.prompts[:prompts],
            num_samples=gen.num_samples,
            max_new_tokens=positions,
            min_new_tokens=positions,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=self.rng,
        )

    def train_groups(self, groups: int, rows: int) -> list[TrainGroup]:
        """`groups` of the step's prompts, `rows` full-length completions each."""
        length = self.config.generation.max_new_tokens
        vocab = len(self.policy.tokenizer)
        made = torch.Generator().manual_seed(0)
        return [
            TrainGroup(
                prompt_ids=torch.tensor(prompt),
                completion_ids=torch.randint(3, vocab, (rows, length), generator=made),
                completion_mask=torch.ones((rows, length), dtype=torch.long),
                behaviour_logprobs=torch.zeros((rows, length)),
                rewards=torch.arange(rows, dtype=torch.float32),
            )
            for prompt in self.prompts[:groups]
        ]

    def train(self, groups: list[TrainGroup]) -> None:
        self.learner.step(groups)

    def tokens(self, groups: list[TrainGroup]) -> int:
        return sum(g.completion_ids.numel() + g.prompt_ids.numel() * g.completion_ids.shape[0] for g in groups)

    def generate_unit(self) -> None:
        """A generator's batch, CORUN_POSITIONS long (the co-run probes' unit)."""
        self.decode(self.batches[0], CORUN_POSITIONS, native=True)

    def train_unit(self) -> None:
        """A training step on one prompt's two completions (the co-run probes' unit)."""
        self.train(self.corun_groups)


def seconds(work: Callable[[], Any], repeats: int = 1) -> float:
    """The fastest of `repeats` timed calls."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def line(x: tuple[float, float], y: tuple[float, float]) -> tuple[float, float]:
    """(intercept, slope) through two points, both lines below going through the second point,
    the configured size, which the simulator then reproduces exactly. Where the cost grew faster
    than linearly (the intercept would be negative): the proportional line. Where the larger size
    came out cheaper (noise on a cost that barely grows: a small model's decode position costs
    the same for 32 rows as for 64): the flat line, not a proportional one, which would charge a
    batch whose rows end early next to nothing (the variable-length shape's sync generation was
    predicted 0.08 s a step against 0.32-0.39 measured)."""
    slope = (y[1] - y[0]) / (x[1] - x[0])
    intercept = y[0] - slope * x[0]
    if slope < 0:
        return y[1], 0.0
    if intercept < 0:
        return 0.0, y[1] / x[1]
    return intercept, slope


def thread_costs(probes: Probes) -> tuple[ThreadCosts, dict[str, Any]]:
    """Decode and training costs at the current thread count."""
    gen = probes.config.generation
    length = gen.max_new_tokens
    timed = min(length - 1, DECODE_POSITIONS)
    decode_points = []
    for prompts in probes.batches:
        first = seconds(partial(probes.decode, prompts, 1), repeats=2)
        per_position = 0.0
        if timed:
            longer = seconds(partial(probes.decode, prompts, 1 + timed), repeats=2)
            per_position = max(0.0, longer - first) / timed
        batch = first + (length - 1) * per_position  # the prompt's pass spread over positions
        decode_points.append((prompts * gen.num_samples, batch / length))
    (x0, y0), (x1, y1) = decode_points
    decode_s, per_seq = line((x0, x1), (y0, y1))
    half = probes.half_groups
    probes.train(probes.step_groups)  # warm: the optimizer's state, the heap a full step needs
    if not probes.warm_half:  # the heap a half step's shapes need: their first one pays its
        probes.train(half)  # page faults (seconds for a 135M model), once a process
        probes.warm_half = True
    sizes = [(probes.tokens(g), seconds(partial(probes.train, g))) for g in (half, probes.step_groups)]
    train_s, per_token = line((sizes[0][0], sizes[1][0]), (sizes[0][1], sizes[1][1]))
    costs = ThreadCosts(decode_s=decode_s, decode_s_per_seq=per_seq, train_s=train_s, train_s_per_token=per_token)
    return costs, {"decode_s_per_position": decode_points, "train_tokens_s": sizes}


def scoring(probes: Probes) -> tuple[float, list[int]]:
    """The config's scorer on a generator batch sampled as the config samples (EOS allowed
    after min_new_tokens): seconds per group, and the completions' lengths."""
    gen, count = probes.config.generation, probes.batches[0]
    batch = sample(
        probes.policy,
        probes.prompts[:count],
        num_samples=gen.num_samples,
        max_new_tokens=gen.max_new_tokens,
        min_new_tokens=gen.min_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        generator=probes.rng,
    )
    prompt_set = make_prompt_set(probes.config.task, probes.config.seed)
    examples = [prompt_set.train_item(i) for i in range(count)]
    groups = pack_groups(probes.policy, batch, examples, [(i, 0) for i in range(count)], 0)
    started = time.perf_counter()
    for group in groups:
        probes.scorer.score(group)
    return (time.perf_counter() - started) / count, batch.completion_mask.sum(1).tolist()


def copy_s(policy: Policy) -> tuple[float, int]:
    """Seconds to copy the weights into one flat buffer (what staging or pulling a version over
    shared memory costs, each way), and their bytes."""
    params = [p.detach() for p in policy.model.parameters()]
    size = sum(p.numel() * p.element_size() for p in params)
    flat = torch.empty(size, dtype=torch.uint8)

    def copy() -> None:
        offset = 0
        for p in params:
            count = p.numel() * p.element_size()
            flat[offset : offset + count].copy_(p.reshape(-1).view(torch.uint8))
            offset += count

    return seconds(copy, repeats=3), size


def coruns(probes: Probes) -> tuple[dict[str, float], float, dict[str, float], dict[str, Any]]:
    """`llamarl.bench.corun.corun` on the profile's units; a vLLM config's generator a vLLM
    engine in a process of its own (`llamarl.bench.engine_probe`)."""
    if probes.engine is None:
        return corun(probes.generate_unit, probes.train_unit)
    engine = EngineProbe(probes.config)
    try:
        return corun(engine, probes.train_unit)
    finally:
        engine.close()


def measure(config: RunConfig) -> tuple[Costs, dict[str, Any]]:
    started = time.perf_counter()
    torch.set_num_threads(1)
    probes = Probes(config)
    loaded = time.perf_counter() - started
    threads: dict[int, ThreadCosts] = {}
    points: dict[str, Any] = {}
    for count in range(1, usable_cores() + 1):
        if count == 2:  # forked while this process has run one thread only, and warm
            slowdown, crowded, jitter, corun_s = coruns(probes)
        torch.set_num_threads(count)
        threads[count], points[str(count)] = thread_costs(probes)
        print(f"profile {count} thread(s): {threads[count]}", file=sys.stderr, flush=True)
    if len(threads) == 1:
        slowdown, crowded, jitter, corun_s = coruns(probes)
    torch.set_num_threads(1)
    stage, size = copy_s(probes.policy)
    pull = stage
    if probes.engine is not None:  # a vLLM generator also loads each version into its engine
        engine = probes.engine
        pull += seconds(lambda: engine.load(probes.policy.model), repeats=2)
    prompt_tokens = statistics.mean(len(p) for p in probes.prompts)
    score_s, lengths = scoring(probes)
    turns, turn_phases = turns_s_per_step(config)
    print(f"profile one_process: {turns:.4f} s/step {turn_phases}", file=sys.stderr, flush=True)
    costs = Costs(
        threads=threads,
        score_s_per_group=score_s,
        stage_s=stage,
        pull_s=pull,
        prompt_tokens=prompt_tokens,
        corun_slowdown=slowdown,
        cores=usable_cores(),
        jitter_cv=jitter,
        oversubscribed_slowdown=crowded,
        completion_lengths=lengths,
        turns_s_per_step=turns,
        turns_phase_s=turn_phases,
    )
    extra = {"model_bytes": size, "load_s": round(loaded, 2), "points": points, "probes_s": corun_s}
    return costs, extra


def profile(config_path: Path, out: Path | None = None, fresh: bool = False) -> dict[str, Any]:
    """The config's profile on this machine: cached, or measured and cached. JSON with the
    profile's path, whether it was cached and the seconds it took. A profile measured while
    other processes kept the machine busy is measured again (`trusted_measure`), and so is a
    cached one that is not `trusted`."""
    started = time.perf_counter()
    config = parse_config(read_tree(config_path))
    cached = cached_profile(config)
    hit = not fresh and cached.exists() and trusted(json.loads(cached.read_text()))
    if not hit:
        costs, extra = trusted_measure(config)
        extra |= {
            "config": str(config_path),
            "machine": machine(),
            "measured_s": round(time.perf_counter() - started, 2),
        }
        costs.save(cached, extra)
    tree = json.loads(cached.read_text())
    if out is not None and out != cached:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(cached.read_text())
    return {
        "profile": str(out or cached),
        "cached": hit,
        "seconds": round(time.perf_counter() - started, 2),
        "costs": tree,
    }


def trusted(cached: dict[str, Any]) -> bool:
    """Whether a cached profile may be used as it is: measured on a quiet machine (one cached
    before the check, without `others_cores`, may not have been), or kept busy while
    LLAMARL_PROFILE_BUSY=accept still says to keep such; and with the turns probe's phases (one
    cached before them, without `turns_phase_s`, cannot calibrate the simulator)."""
    if "others_cores" not in cached or not cached.get("turns_phase_s"):
        return False
    return not cached.get("busy") or os.environ.get("LLAMARL_PROFILE_BUSY") == "accept"


def trusted_measure(config: RunConfig) -> tuple[Costs, dict[str, Any]]:
    """`measure`, again while other processes used more than BUSY_CORES on average (up to
    MEASURE_ATTEMPTS times in all); still busy, a ConfigError. An attempt first watches the
    machine for QUIET_CHECK_S and does not measure a machine busy already (RETRY_WAIT_S before
    the next). With LLAMARL_PROFILE_BUSY=accept the first measurement is kept whatever the load,
    marked `busy` if it was. `others_cores` records what the kept measurement shared the machine
    with."""
    accept = os.environ.get("LLAMARL_PROFILE_BUSY") == "accept"
    for attempt in range(1, MEASURE_ATTEMPTS + 1):
        if attempt > 1:
            time.sleep(RETRY_WAIT_S)
        cores, when = (0.0 if accept else others_now(QUIET_CHECK_S)), "before it measured"
        if cores <= BUSY_CORES:
            with OtherLoad() as load:
                costs, extra = measure(config) if attempt == 1 else measure_apart(config)
            cores, when = load.cores, "while it measured"
            extra |= {"others_cores": cores, "busy": cores > BUSY_CORES}
            if accept or not extra["busy"]:
                return costs, extra
        print(
            f"profile: other processes used {cores:.2f} cores on average {when} "
            f"(attempt {attempt} of {MEASURE_ATTEMPTS})",
            file=sys.stderr,
            flush=True,
        )
    raise ConfigError(
        f"profile: the machine stayed busy ({cores:.2f} cores used by other processes {when}, "
        f"{MEASURE_ATTEMPTS} times); its figures would misjudge every layout: stop what else runs, "
        "set workers.layout (one_process or split) to start without a profile, or "
        "LLAMARL_PROFILE_BUSY=accept to keep a busy profile"
    )


def cached_profile(config: RunConfig) -> Path:
    return cache_dir() / "profiles" / f"{cache_key(config)}.json"
