"""Shared bench helpers: thread pinning, a measured matmul peak, peak RSS, JSON output."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from dalle_dist.model.transformer import Transformer
    from dalle_dist.train.compile import CompiledBlocks


def set_threads(threads: int) -> None:
    """`threads` for the ops, one inter-op thread. torch takes the inter-op count once per
    process, so a second bench main() in one process (tests/test_train_side_by_side.py)
    leaves it as the first set it."""
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:
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


#: Variables that change a CPU figure: glibc's malloc tuning (MALLOC_MMAP_THRESHOLD_ ...),
#: an allocator preloaded in its place (LD_PRELOAD: jemalloc, tcmalloc), thread counts.
ENV_PREFIXES = ("MALLOC_", "LD_PRELOAD", "OMP_", "MKL_", "KMP_")


def machine() -> dict[str, Any]:
    """What ran the figures: the CPU's model name, its logical CPUs, the vector ISA torch's
    CPU kernels dispatch to, the GPU if one is used, and the environment variables that
    change the allocator or the threads, where set. Ratios against another project move
    with both: bench/train_side_by_side.py read full attention at 1024 tokens 1.88x on a
    VM whose fp32 matmul peak was 200 GFLOP/s and 2.11x on a 445 GFLOP/s AVX-512 one, and
    1.64x on the latter with glibc's mmap threshold fixed (DALLE-pytorch's step then stops
    faulting in its score tensors' pages on every allocation; docs/benchmarks.md)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            names = [line.split(":", 1)[1].strip() for line in info
                     if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    record: dict[str, Any] = {"cpu": cpu, "logical_cpus": os.cpu_count(),
                              "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    env = {name: value for name, value in sorted(os.environ.items())
           if name.startswith(ENV_PREFIXES)}
    if env:
        record["env"] = env
    return record


def compile_fresh(transformer: Transformer, backend: str | None = None) -> CompiledBlocks:
    """compile_blocks on a cleared dynamo, as `train --compile` starts: in a process of its
    own. Dynamo keeps a block's graphs per code object for the whole process, so a bench
    that compiles models of several sizes in turn would otherwise get, for the second
    size, a graph with the sequence length symbolic (automatic dynamic shapes: other
    kernels than the static ones a training run compiles, so other timings), and would
    stop with fullgraph's hard error at the 9th graph (dynamo's recompile_limit, 8).
    backend: train --compile_backend's (default inductor). Imported here: the scripts
    that only share this module's timing run under DALLE-pytorch's interpreter too."""
    import torch._dynamo

    from dalle_dist.train.compile import DEFAULT_BACKEND, compile_blocks

    torch._dynamo.reset()
    return compile_blocks(transformer, backend or DEFAULT_BACKEND)


def keep_train_heap() -> bool:
    """What `train` does on CPU before its first step (train/cpu_settings.keep_heap): glibc's
    malloc keeps freed memory for the next step. A bench that times our step alone, as a
    training process runs it, makes the same setting; without it the step faults its
    largest tensors in afresh (docs/benchmarks.md: CPU training 5 to 10% slower). Imported
    here, as in compile_fresh."""
    from dalle_dist.train.cpu_settings import keep_heap

    return keep_heap(torch.device("cpu"))


def emit(result: dict[str, Any]) -> None:
    """The result as indented JSON on stdout, with the machine (machine()) added unless
    the script recorded it."""
    result.setdefault("machine", machine())
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


def comma_list(parser: argparse.ArgumentParser, flag: str, value: str,
               choices: Collection[str] | None = None) -> list[str]:
    """`flag`'s comma list, checked before anything is built or timed: an empty entry, or
    one outside `choices`, is argparse's usage error (exit 2), not a traceback part-way
    through a run, nor a name no branch reads that the run would time as a default."""
    items = [item.strip() for item in value.split(",")]
    if "" in items:
        parser.error(f"{flag} {value!r}: an empty entry")
    unknown = [item for item in items if choices is not None and item not in choices]
    if unknown:
        parser.error(f"{flag}: unknown {', '.join(map(repr, unknown))} "
                     f"(known: {', '.join(choices or ())})")
    return items


def positive_ints(parser: argparse.ArgumentParser, flag: str, text: str,
                  sep: str = ",") -> list[int]:
    """`text` (all or part of `flag`'s value) split at `sep`, each an int of at least 1, or
    the usage error."""
    values = text.split(sep)
    try:
        numbers = [int(value) for value in values]
    except ValueError:
        numbers = []
    if len(numbers) != len(values) or min(numbers, default=1) < 1:
        parser.error(f"{flag}: {text!r} is not positive integers separated by {sep!r}")
    return numbers


def square_tokens(parser: argparse.ArgumentParser, flag: str, tokens: int) -> int:
    """`tokens` (an image grid's token count) if it is a positive square, else the usage
    error: a bench takes its side with isqrt, so 99 would silently time 81."""
    if tokens < 1 or math.isqrt(tokens) ** 2 != tokens:
        parser.error(f"{flag}: {tokens} image tokens are not a square grid (e.g. 256, 1024)")
    return tokens


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     *names: str) -> None:
    """The usage error unless each named integer flag that is set is at least 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, not {value}")


def add_model_size_args(parser: argparse.ArgumentParser) -> None:
    """The bench model's size flags (dim 256, depth 4, 4 x 64 heads, text 32 of 1000
    tokens), one definition for the training benches that build it."""
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim_head", type=int, default=64)
    parser.add_argument("--text_seq_len", type=int, default=32)
    parser.add_argument("--num_text_tokens", type=int, default=1000)
