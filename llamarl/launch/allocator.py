"""glibc's allocator told to keep the memory a step frees for the next step.

A training step frees and allocates the same large tensors every step (activations, gradients,
logits over the vocabulary). By default glibc serves blocks above a threshold (128 KiB, rising
with use to 32 MiB) straight from the kernel and unmaps them on free, and hands the top of its
heap back beyond 128 KiB, so each step faults the same pages in again, zeroed by the kernel. Here
every block comes from the heap and the heap keeps up to 1 GiB free at its top: after its first
steps a process reuses its own memory. A one-thread SmolLM2-135M trainer
(configs/bench_smollm2_generation_heavy.yaml, split layout): 2.6 s a step with these settings,
5.7 s without, of which more than half was the kernel's (7.3 million page faults in 10 steps,
2.4 million with them). The cost: memory freed inside the heap is reused but not returned.

Every `llamarl` command sets it first thing (workers/cli.py: the sync loop, a profile, benches),
and so does every trainer rank (workers/trainer.py), so both modes train with it; elsewhere than
glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 1024**3), (M_TOP_PAD, 64 * 1024**2))
"""No block from mmap; up to 1 GiB free at the heap's top kept; the heap grown 64 MiB at a time."""


def keep_freed_memory() -> bool:
    """Apply SETTINGS to glibc's allocator; whether it took them all."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl, or no glibc
        return False
    return all(mallopt(option, value) == 1 for option, value in SETTINGS)
