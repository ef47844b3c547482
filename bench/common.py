"""Shared bench helpers: thread pinning, a measured matmul peak, peak RSS, JSON output."""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def matmul_peak_flops(size: int = 2048, repeats: int = 5) -> float:
    """Best fp32 FLOP/s of a square matmul: the machine's practical peak at this thread count."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_steps(step: Callable[[], None], warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def emit(result: dict[str, Any]) -> None:
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


#: The dtypes whose matmul peak MFU is measured against; "tf32" is fp32 with TF32 tensor
#: cores (what fp32 training runs in on CUDA when TF32 is on).
PEAK_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
               "fp16": torch.float16}


def device_matmul_peak(device: torch.device, name: str, size: int, repeats: int = 5,
                       inner: int = 1) -> float:
    """Best FLOP/s of `inner` square matmuls of side `size` in PEAK_DTYPES[name] on
    `device`: the practical peak training's MFU is held against. On CUDA each timing is
    fenced by synchronize (an idle GPU; nothing else queued)."""
    dtype = PEAK_DTYPES[name]
    cuda = device.type == "cuda"
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
    try:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        best = float("inf")
        for attempt in range(repeats + 2):
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(inner):
                a @ b
            if cuda:
                torch.cuda.synchronize(device)
            if attempt >= 2:  # the first two warm the kernels and the allocator
                best = min(best, time.perf_counter() - start)
    finally:
        torch.set_float32_matmul_precision(saved)
    return 2 * size**3 * inner / best
