"""--activation_checkpointing (--reversible): peak memory and step time with and without it.

A demo-sized DALL-E (train's defaults: dim 128, depth 4, 48 text + 64 image tokens, batch
32, fp32 on the CPU) and a longer-sequence one (256 image tokens, batch 8). Memory: each
mode in a fresh process, measured as tests/accuracy/plan_check.py measures (peak resident set of a
third training step above the process before the model, glibc returning every large
block at once), beside `plan`'s estimate for the same flags. Time: median of training
steps (forward, backward, Adam) of both modes in this process, alternating.

Prints JSON: per config and mode, measured and estimated peak bytes and the median step
time; and per config the ratios (memory saved, time added).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests/

from common import emit, median, set_threads

from tests.accuracy.plan_check import Case, run_case

CASES = (
    Case("demo-fp32-b32", batch=32),
    Case("256tok-fp32-b8", batch=8, text_seq_len=32, image_size=64),
)


def step_times(case: Case, steps: int) -> dict[bool, float]:
    """Median seconds of a training step without and with checkpointing (alternating, so
    both see the same machine load)."""
    import time

    import torch

    from dalle_dist.model import DALLE
    from dalle_dist.train.optim import make_adam

    dalle_cfg, _ = case.configs()
    g = torch.Generator().manual_seed(0)
    text = torch.randint(1, case.num_text_tokens, (case.batch, case.text_seq_len), generator=g)
    tokens = torch.randint(0, case.num_tokens, (case.batch, dalle_cfg.image_seq_len), generator=g)
    models = {}
    for mode in (False, True):
        torch.manual_seed(0)
        model = DALLE(dalle_cfg)
        model.transformer.set_checkpointing(mode)
        models[mode] = (model, make_adam(model.parameters(), 1e-3))
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(steps + 2):
        for mode, (model, optimizer) in models.items():
            start = time.perf_counter()
            model(text, tokens)["loss"].backward()
            optimizer.step()
            optimizer.zero_grad()
            if i >= 2:  # two warm-up steps
                times[mode].append(time.perf_counter() - start)
    return {mode: median(t) for mode, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    results = []
    for case in CASES:
        memory = {mode: run_case(replace(case, checkpointing=mode), "cpu")
                  for mode in (False, True)}
        times = step_times(case, args.steps)
        modes = {("checkpointed" if mode else "plain"): {
            "measured_peak_bytes": memory[mode]["measured"],
            "estimated_peak_bytes": memory[mode]["estimated"],
            "estimate_ratio": memory[mode]["ratio"],
            "step_seconds": round(times[mode], 4)} for mode in (False, True)}
        results.append({
            "case": case.name, "batch": case.batch, "dim": case.dim, "depth": case.depth,
            **modes,
            "memory_ratio": round(memory[True]["measured"] / memory[False]["measured"], 3),
            "time_ratio": round(times[True] / times[False], 3)})
    emit({"bench": "activation_checkpointing", "device": "cpu", "threads": args.threads,
          "results": results})


if __name__ == "__main__":
    main()
