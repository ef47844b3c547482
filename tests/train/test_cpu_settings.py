"""glibc's malloc keeps a CPU training run's freed memory for the next step
(train/cpu_settings.py): the setting takes effect, is left to the user where they chose,
and every CPU `train` run makes it.

The effect is read as the kernel sees it around a 40 MiB block that is allocated, written
and freed five times through the C library itself: whether the free hands the block's
pages back (the resident set, VmRSS, drops by the block) and how many minor page faults
(getrusage) writing it again costs. Under glibc's defaults such a block (over the 32 MiB
that malloc's adaptive mmap threshold can reach) is mapped afresh and handed back every
time, as a training step's largest tensors were. Torch's own allocations would show the
same, but when a freed tensor is reused depends on the heap's history, so a test on them
reads differently from run to run. The faults are asserted only where the block stays:
with transparent huge pages on for every mapping, a mapped block faults in 2 MiB at a
time, so their count would not tell the two apart there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from dalle_dist.train.cpu_settings import HEAP_KEPT, glibc, user_malloc_choice
from tests.backends.runs import Run

BLOCK_KIB = 40 << 10

#: one process: keep_heap for the device named by argv[1], then the block five times; per
#: time, the faults while writing it and how far the resident set fell at its free (KiB)
PROBE = """
import ctypes, json, resource, sys
import torch
from dalle_dist.train.cpu_settings import keep_heap

def resident_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))

kept = keep_heap(torch.device(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
faults, handed_back = [], []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(40 << 20)
    ctypes.memset(block, 1, 40 << 20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    written = resident_kib()
    libc.free(block)
    handed_back.append(written - resident_kib())
print(json.dumps({"kept": kept, "faults": faults, "handed_back": handed_back}))
"""


def probe(device: str, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if user_malloc_choice({k: v}) is None}
    result = subprocess.run([sys.executable, "-c", PROBE, device], capture_output=True,
                            text=True, env={**clean, **env}, timeout=120, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(glibc() is None, reason="glibc's malloc only")
def test_a_cpu_run_reuses_its_freed_memory_instead_of_faulting_it_in_again() -> None:
    """Fails if the mmap threshold is not raised (the block is mapped every time) or the trim
    threshold is not (the block comes from the heap, whose free top is handed back at
    each free); if the setting reaches a CUDA run; or if it overrides a user's variable."""
    reading = probe("cpu")
    assert reading["kept"], reading
    assert max(reading["handed_back"]) < BLOCK_KIB // 20, reading  # the block stays
    assert max(reading["faults"][1:]) < 50, reading  # and is written again without a fault
    for device, env in (("cuda", {}), ("cpu", {"MALLOC_TRIM_THRESHOLD_": "131072"})):
        reading = probe(device, **env)
        assert not reading["kept"], (device, env, reading)
        assert min(reading["handed_back"]) > BLOCK_KIB * 0.9, (device, env, reading)


def test_a_users_own_malloc_settings_are_theirs() -> None:
    """Fails if a variable by which the user tunes glibc's malloc, or another allocator they
    preload, is overridden; or if an unrelated tunable counts as such a choice."""
    assert user_malloc_choice({}) is None
    assert user_malloc_choice({"MALLOC_MMAP_THRESHOLD_": "65536"}) == "MALLOC_MMAP_THRESHOLD_"
    assert user_malloc_choice({"MALLOC_ARENA_MAX": "2"}) == "MALLOC_ARENA_MAX"
    assert user_malloc_choice({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) \
        == "GLIBC_TUNABLES"
    assert user_malloc_choice({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}) is None
    assert user_malloc_choice({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "LD_PRELOAD"
    assert user_malloc_choice({"LD_PRELOAD": "/opt/libfoo.so"}) is None


@pytest.mark.skipif(glibc() is None, reason="glibc's malloc only")
def test_a_cpu_training_run_keeps_its_heap(trained: Callable[..., Run]) -> None:
    """The one-process `trained` run logs it once, after the headline and before its first
    step (every backend's run goes through the same RunSetup.train; a 2-rank run's other
    ranks log nothing). Fails if RunSetup.train does not call keep_heap (a run without it
    logs nothing), or calls it before the model is distributed."""
    log = trained("single", "fp32").text
    assert log.count(HEAP_KEPT) == 1, log[-3000:]
    first_step = log.index("the first step's matmuls ran")  # logged after step 1
    assert log.index("training DALL-E") < log.index(HEAP_KEPT) < first_step
