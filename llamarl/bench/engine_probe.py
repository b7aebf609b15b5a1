"""The co-run probes' generator for a vLLM config: a vLLM engine in a process of its own, started
as a generator of a split starts it (one torch thread, its engine core in the process, the
config's model and weights), repeating a generator's batch on order.

The profile's other probes are forked copies of the profiling process (`llamarl.bench.corun`),
which decode natively: a forked process cannot run a vLLM engine, and vLLM's CPU backend slows
a trainer beside it far more than our sampler does (on the SmolLM2 vLLM example the trainer took
3.07 s a step beside it, where the native probe predicted 1.8). So this probe is a spawned
`python -m llamarl.bench.engine_probe CONFIG`, spoken to in JSON lines: on its stdin an order
(`{"threads": 1, "core": 0}`: every thread of the process moved to that core, or to every core
for null), `{"go": true}` (repeat the batch for CORUN_S, reply every repeat's seconds) or
`{"quit": true}`; on its stdout `{"ready": true}` when warm and after each order, and
`{"times": [...]}`. What vLLM prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from llamarl.bench.corun import CORUN_S, REPLY_S
from llamarl.bench.turns_probe import resolved_env
from llamarl.config import RunConfig
from llamarl.config.run import dump_config, load_config


class EngineProbe:
    """The parent's side: a spawned vLLM generator repeating its batch on order (the interface
    of `llamarl.bench.corun.Probe`, its go given by `start`)."""

    def __init__(self, config: RunConfig) -> None:
        self.label = "generate"
        self.directory = tempfile.TemporaryDirectory(prefix="llamarl-engine-probe-")
        path = Path(self.directory.name) / "probe.yaml"
        path.write_text(dump_config(config))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llamarl.bench.engine_probe", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=resolved_env(),
        )

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> bytes:
        """The next line it writes (b'ready' or the repeats' JSON list, as a forked probe's)."""
        assert self.proc.stdout is not None
        line = _line_within(self.proc.stdout, REPLY_S)
        if not line:
            raise RuntimeError(
                f"profile: the vLLM generator probe ended (exit {self.proc.poll()}); its stderr above says why"
            )
        message = json.loads(line)
        return b"ready" if message.get("ready") else json.dumps(message["times"]).encode()

    def order(self, threads: int, core: int | None) -> None:
        self._send({"threads": threads, "core": core})

    def start(self) -> None:
        self._send({"go": True})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"quit": True})
                self.proc.wait(60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.directory.cleanup()


def _line_within(stream: IO[str], timeout_s: float) -> str:
    """A line from `stream` (empty at its end); RuntimeError when none came in `timeout_s`."""
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise RuntimeError(f"profile: the vLLM generator probe did not answer in {timeout_s} s")
    return stream.readline()


def _pin_every_thread(cores: set[int]) -> None:
    """This process's threads, the engine's included, on `cores`."""
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), cores)


def serve(config: RunConfig, out: IO[str]) -> None:
    """The probe's side (see the module): a generator's batch on the config's vLLM engine."""
    import torch

    from llamarl.engine.adapters import with_adapters
    from llamarl.engine.model import make_policy
    from llamarl.launch.cores import encoded_prompts
    from llamarl.roles.build import start_engine

    every_core = os.sched_getaffinity(0)
    torch.set_num_threads(1)  # a split's generator: one thread a core
    gen = config.generation
    policy = with_adapters(make_policy(config.model, config.seed), config.model.lora, config.seed)
    engine = start_engine(config, policy, config.seed)
    prompts = encoded_prompts(config, policy, gen.prompts_per_batch)
    rng = torch.Generator().manual_seed(config.seed)

    def batch() -> None:
        engine.sample(
            policy,
            prompts,
            num_samples=gen.num_samples,
            max_new_tokens=gen.max_new_tokens,
            min_new_tokens=gen.max_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=rng,
        )

    batch()
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("quit"):
            return
        if "core" in message:
            _pin_every_thread({message["core"]} if message["core"] is not None else every_core)
            out.write(json.dumps({"ready": True}) + "\n")
            continue
        times: list[float] = []
        ends = time.perf_counter() + CORUN_S
        while time.perf_counter() < ends or not times:
            started = time.perf_counter()
            batch()
            times.append(time.perf_counter() - started)
        out.write(json.dumps({"times": times}) + "\n")


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)  # the replies' own descriptor
    os.dup2(2, 1)  # whatever else writes to stdout (vLLM, torch) goes to stderr
    serve(load_config(argv[0], environ={}), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
