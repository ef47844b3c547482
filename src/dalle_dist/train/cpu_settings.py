"""The process-wide host setting a CPU run makes once, before its loop (training's first step,
`encode`'s first batch): glibc's malloc keeps the memory a step frees for the next step.

Why: a training step allocates and frees the same tensors every step, many of them
megabytes (a feed-forward activation at 1024 image tokens, batch 2: 8.6 MB). Under glibc's
defaults a block over the mmap threshold (128 KiB, rising with what is freed, to 32 MiB at
most) is mapped afresh at each allocation, and whenever more than the trim threshold lies
free at the top of the heap after a backward, the heap is handed back to the kernel. Either
way the next step touches new pages: a `train` run of the bench model took 18,000 to
29,000 minor page faults a step, each page zeroed by the kernel before the step may use
it. Kept (mmap threshold 1 GiB, trim threshold 2 GiB), the same run's steps fault next to
nothing and it trains 5 to 10% faster (bench/heap_kept.py, docs/benchmarks.md
"Training"); the peak resident memory stays within a few percent of the defaults' (4%
over a run with sample grids, validation and saves, whose odd shapes the heap keeps room
for) and is no longer handed back between steps. `encode` on CPU frees and allocates its
VAE's activations the same way at every batch: kept, it encoded 10,000 built-in shapes at
64 px 1.3 x as fast (2.8 million page faults down to 72,000), at the same peak (366 against
368 MB).

Set just before the loop, after the model was built, distributed and restored, so start-up
(a checkpoint read whole, a model sharded) frees its memory to the kernel as before (in a
`train` that first trains the built-in VAE, from that VAE's first step on).
On CUDA the step's tensors live in torch's caching allocator and nothing is touched, nor
where the user chose for malloc (MALLOC_* variables, GLIBC_TUNABLES' glibc.malloc, another
allocator in LD_PRELOAD) or where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

import torch

#: mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: a block up to this size comes from the heap, so it is reused rather than mapped again
MMAP_THRESHOLD = 1 << 30
#: the free top of the heap is handed back only beyond this (mallopt takes a C int)
TRIM_THRESHOLD = (1 << 31) - 1
#: malloc settings of the user's own, which this module leaves as they are
USER_MALLOC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                         "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX")
#: allocators a user preloads instead of glibc's malloc
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def heap_kept_line(unit: str, units: str) -> str:
    """What a run logs when it keeps the heap, `unit` (plural `units`) being what its loop
    repeats."""
    return (f"glibc's malloc keeps the memory a {unit} frees for the next one ({units} reuse "
            "it rather than fault in fresh pages; set MALLOC_TRIM_THRESHOLD_ to choose "
            "otherwise)")


#: what a training run logs (train, train-vae)
HEAP_KEPT = heap_kept_line("step", "steps")
#: what `encode` logs
HEAP_KEPT_ENCODE = heap_kept_line("batch", "batches")


def user_malloc_choice(environ: Mapping[str, str] = os.environ) -> str | None:
    """The variable by which the user chose how malloc behaves, or None."""
    for name in USER_MALLOC_VARIABLES:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if any(name in environ.get("LD_PRELOAD", "") for name in OTHER_ALLOCATORS):
        return "LD_PRELOAD"
    return None


def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (os.confstr answers only there)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (AttributeError, ValueError, OSError):  # no confstr, or not a name it knows
        return None
    return ctypes.CDLL(None)


_kept = False  # set in this process already (the built-in VAE's training, then DALL-E's)


def keep_heap(device: torch.device) -> bool:
    """Sets glibc's mmap and trim thresholds for a CPU run (see the module's docstring);
    returns whether this call set them, so a process that trains twice (the built-in VAE,
    then DALL-E) logs it once. Every rank makes it for itself."""
    global _kept
    if _kept or device.type != "cpu" or user_malloc_choice() is not None:
        return False
    libc = glibc()
    if libc is None:
        return False
    _kept = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _kept
