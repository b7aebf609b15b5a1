"""glibc's setting (llamarl/launch/allocator.py), on the real allocator. Kept, a large tensor
allocated again and again, as a training step does, soon comes from memory the process already
has instead of pages the kernel faults in anew (the first few land beside the freed ones, which
torch's alignment cannot reuse, until freed neighbours merge); lean, and by glibc's default,
every allocation faults its pages in again. A trainer keeps unless its ranks' estimate is over a
quarter of the host's memory (`memory_check.trainer_memory`; the host's memory is set in the
case's process). Each case runs in a fresh interpreter, so the settings apply from its start and
never to the test process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MIB = 64
PAGES = MIB * 1024 * 1024 // 4096
ROUNDS = 24

PROGRAM = f"""
import json, resource, sys
from llamarl.config import parse_config
from llamarl.launch.allocator import keep_freed_memory, return_freed_memory
from llamarl.training import memory_check
from llamarl.training.memory import Shapes

mode = sys.argv[1]
took = keep_freed_memory() if mode != "default" else None
if mode.startswith("trainer"):  # a tiny trainer on a host with ample memory, or just enough
    config = parse_config({{"model": {{"hidden_size": 32, "num_layers": 1, "num_heads": 2}}}})
    need = memory_check.host_need(config, Shapes().of(config.model), generators=False)[0]
    limit = 100 * need if mode == "trainer-ample" else 2 * need
    memory_check.host_memory = lambda: (limit, "the test's host")
    memory_check.trainer_memory(config, return_freed_memory)
import torch
torch.set_num_threads(1)
faults = []
for _ in range({ROUNDS}):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.empty({MIB} * 1024 * 1024, dtype=torch.uint8)
    block.fill_(1)  # touch every page
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({{"took": took, "faults": faults}}))
"""

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def faults_per_allocation(mode: str) -> tuple[bool | None, list[int]]:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    return result["took"], result["faults"]


@glibc_only
@pytest.mark.parametrize("mode", ["kept", "trainer-ample"])
def test_kept_a_freed_block_is_reused_without_page_faults(mode: str) -> None:
    took, faults = faults_per_allocation(mode)
    assert took is True
    assert faults[0] >= PAGES // 2, "the first allocation faults its pages in"
    assert sum(faults[-8:]) < PAGES // 10, faults


@glibc_only
@pytest.mark.parametrize("mode", ["default", "trainer-near"])
def test_lean_or_by_default_every_allocation_faults_again(mode: str) -> None:
    _, faults = faults_per_allocation(mode)
    assert min(faults) >= PAGES // 2, faults
