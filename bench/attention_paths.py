"""The attention paths of one pattern, timed in turns in one process, as JSON.

bench/attention.py runs each (pattern, path) in processes of its own, which also gives
each a clean peak-memory reading, but on this VM one process's speed differs from the
next's by tens of percent: enough to reverse which path is faster. Here every path of a
pattern is one Attention layer (dim 256 = 4 heads x 64, text 32 + <bos>) over the same
input, and each round times one forward + backward of each, starting one place further
along each round, so a drift of the machine's speed weighs on all alike. Reported per
path: the median over the rounds, and its ratio to the `auto` path's (what training
uses on this device). These medians chose `auto`'s CPU thresholds (model/attention.py:
AXIAL_MATMUL_MIN_SIDE, CONV_MATMUL_MIN_SIDE).

    .venv/bin/python bench/attention_paths.py [--patterns axial_row,conv_like]
        [--sides 8,12,16,32] [--impls matmul,gather,sdpa]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, set_threads

from dalle_dist.model.attention import Attention, resolve_impl
from dalle_dist.model.patterns import SequenceLayout, build_pattern

DIM, HEADS, DIM_HEAD, TEXT = 256, 4, 64, 33


def batch_for(side: int) -> int:
    """bench/attention.py's batches: 8 up to 16 x 16 cells, then 2."""
    return 8 if side <= 16 else 2


def compare(pattern: str, side: int, impls: list[str], rounds: int) -> dict:
    layout = SequenceLayout(text_len=TEXT, fmap_size=side)
    built = build_pattern(pattern)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    x = torch.randn(batch_for(side), layout.seq_len, DIM)
    layers = {}
    for impl in ["auto", *impls]:
        torch.manual_seed(1)  # the same weights for every path
        layers[impl] = Attention(DIM, HEADS, DIM_HEAD, 0.0, built, impl)

    def step(layer: Attention) -> float:
        inputs = x.detach().requires_grad_()
        start = time.perf_counter()
        layer(inputs, layout).sum().backward()
        seconds = time.perf_counter() - start
        layer.zero_grad(set_to_none=True)
        return seconds

    for layer in layers.values():
        step(layer)  # builds its masks once, as training does
    times: dict[str, list[float]] = {impl: [] for impl in layers}
    order = list(layers)
    for r in range(rounds):
        for impl in order[r % len(order):] + order[:r % len(order)]:
            times[impl].append(step(layers[impl]))
    medians = {impl: statistics.median(t) for impl, t in times.items()}
    return {"pattern": pattern, "side": side, "image_tokens": side * side,
            "batch": batch_for(side),
            "paths": {impl: {"path": resolve_impl(impl, built, cpu, layout),
                             "fwd_bwd_ms": round(1e3 * medians[impl], 2),
                             "vs_auto": round(medians[impl] / medians["auto"], 3)}
                      for impl in layers}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", default="axial_row,axial_col,conv_like")
    parser.add_argument("--sides", default="8,12,16,24,32")
    parser.add_argument("--impls", default="matmul,gather,sdpa")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    impls = args.impls.split(",")
    results = [compare(pattern, int(side), impls, args.rounds)
               for side in args.sides.split(",") for pattern in args.patterns.split(",")]
    emit({"bench": "attention_paths", "threads": args.threads, "rounds": args.rounds,
          "torch": torch.__version__, "results": results})


if __name__ == "__main__":
    main()
