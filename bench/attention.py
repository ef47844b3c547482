"""Attention patterns: forward + backward time and peak memory, printed as JSON.

For each pattern and each path (`auto` = what training uses on this device, and `sdpa` =
the same pattern as a dense boolean mask), one attention layer (dim 256 = 4 heads x 64)
over text_seq_len 32 plus 256 image tokens at batch 8, and 1024 image tokens at batch 2.
Each case runs in two fresh processes. Memory: glibc is told to map every allocation over
64 KiB on its own (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the resident set at
once and its peak (VmHWM, reset through /proc/self/clear_refs) over one forward +
backward is the peak of live tensors. Time, with the normal allocator: median of 5
after 2 warm-ups, 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import comma_list, emit, median, require_positive

from dalle_dist.model.attention import ATTN_IMPLS
from dalle_dist.model.patterns import PATTERNS

SIZES = ((256, 8), (576, 4), (1024, 2))  # (image tokens, batch)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run_case(pattern: str, impl: str, image_tokens: int, batch: int, threads: int,
             measure: str, random_blocks: int | None) -> dict:
    import torch

    from dalle_dist.model.attention import Attention, resolve_impl
    from dalle_dist.model.patterns import PatternOptions, SequenceLayout, build_pattern

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    side = int(image_tokens**0.5)
    layout = SequenceLayout(text_len=33, fmap_size=side)
    built = build_pattern(pattern, PatternOptions(sparse_random_blocks=random_blocks))
    layer = Attention(256, 4, 64, 0.0, built, impl)
    x = torch.randn(batch, layout.seq_len, 256, requires_grad=True)

    def step() -> None:
        layer(x, layout).sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    step()  # builds masks and layouts once, as training does
    result = {"pattern": pattern, "impl": impl,
              "path": resolve_impl(impl, built, torch.device("cpu"), layout),
              "image_tokens": image_tokens, "batch": batch, "seq_len": layout.seq_len}
    if measure == "memory":
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set
        base = _status_kb("VmRSS")
        step()
        result["peak_mb"] = round((_status_kb("VmHWM") - base) / 1024, 1)
        return result
    step()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    result["fwd_bwd_ms"] = round(median(times) * 1000, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--impls", default="auto,sdpa")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sparse_random_blocks", type=int, default=None)
    args = parser.parse_args()
    require_positive(parser, args, "threads", "sparse_random_blocks")
    patterns = comma_list(parser, "--patterns", args.patterns, PATTERNS)
    impls = comma_list(parser, "--impls", args.impls, ATTN_IMPLS)
    if args.case:
        pattern, impl, tokens, batch, measure = args.case.split(":")
        print(json.dumps(run_case(pattern, impl, int(tokens), int(batch), args.threads,
                                  measure, args.sparse_random_blocks)))
        return
    results = []
    extra = ([] if args.sparse_random_blocks is None
             else ["--sparse_random_blocks", str(args.sparse_random_blocks)])
    for tokens, batch in SIZES:
        for pattern in patterns:
            for impl in impls:
                case = {}
                for measure in ("time", "memory"):
                    env = dict(os.environ)
                    if measure == "memory":
                        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
                    out = subprocess.run([sys.executable, __file__, "--case",
                                          f"{pattern}:{impl}:{tokens}:{batch}:{measure}",
                                          "--threads", str(args.threads), *extra],
                                         capture_output=True, text=True, check=True, env=env)
                    case.update(json.loads(out.stdout.strip().splitlines()[-1]))
                results.append(case)
    for tokens, _ in SIZES:  # each pattern against full attention at the same size
        full = next((r for r in results if r["pattern"] == "full" and r["path"] == "sdpa"
                     and r["image_tokens"] == tokens), None)
        if full is None:
            continue
        for r in results:
            if r["image_tokens"] == tokens:
                r["time_vs_full"] = round(r["fwd_bwd_ms"] / full["fwd_bwd_ms"], 3)
                r["memory_vs_full"] = round(r["peak_mb"] / max(full["peak_mb"], 1e-9), 3)
    emit({"bench": "attention", "threads": args.threads, "results": results})


if __name__ == "__main__":
    main()
