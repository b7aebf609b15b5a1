"""glibc's allocator: keep the memory a step frees for the next step (fast), or hand every large
block back to the kernel when it is freed (lean). Elsewhere than glibc both do nothing.

Fast (`keep_freed_memory`). A training step frees and allocates the same large tensors every step
(activations, gradients, logits over the vocabulary). By default glibc serves blocks above a
threshold (128 KiB, rising with use to 32 MiB) straight from the kernel and unmaps them on free,
and hands the top of its heap back beyond 128 KiB, so each step faults the same pages in again,
zeroed by the kernel. Kept, every block comes from the heap and the heap keeps up to 1 GiB free at
its top: after its first steps a process reuses its own memory. A one-thread SmolLM2-135M trainer
(configs/bench_smollm2_generation_heavy.yaml, split layout): 2.6-3.1 s a step kept, 5.7 s lean,
of which more than half was the kernel's (7.2 million page faults in 10 steps, 2.5 million kept).
Every `llamarl` command keeps from its start (workers/cli.py: the sync loop, a profile, benches),
and so does every trainer rank (workers/trainer.py).

Lean (`return_freed_memory`). Memory freed inside the heap is reused but never returned, and a
block torch's alignment cannot fit into a freed one grows the heap: an fsdp rank of the 0.5B bench
model on two CPU ranks peaked at 10.2 GiB with glibc's default against 6.4 GiB lean. A trainer
whose ranks' memory estimate is over a quarter of the host's memory goes lean
(`llamarl.training.memory_check.trainer_memory`, which workers/common.py hands this function).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
KEEP = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 1024**3), (M_TOP_PAD, 64 * 1024**2))
"""No block from mmap; up to 1 GiB free at the heap's top kept; the heap grown 64 MiB at a time."""
LEAN = ((M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, 1 << 20))
"""mmap allowed again (glibc's default count) for every block of 1 MiB or more."""


def _mallopt() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt: Callable[[int, int], int] = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl, or no glibc
        return None
    return mallopt


def _apply(settings: tuple[tuple[int, int], ...]) -> bool:
    mallopt = _mallopt()
    return mallopt is not None and all(mallopt(option, value) == 1 for option, value in settings)


def keep_freed_memory() -> bool:
    """The fast setting (KEEP); whether glibc took it."""
    return _apply(KEEP)


def return_freed_memory() -> bool:
    """The lean setting (LEAN); whether glibc took it."""
    return _apply(LEAN)
