"""DALLE-pytorch 1.6.6's cached sampling and ours, timed in turns in one process, as JSON.

bench/generate.py and bench/generate_reference.py run one after the other in two processes.
On this VM, whose speed drifts by a third within minutes, their ratio for the same code read
2.6x in one pair of runs and 1.3x twenty minutes later. Here every round samples one image
(batch 1, VAE decoding included) with each contender in turn, starting one place further
along each round, and the ratios are of the medians over the rounds: a drift weighs on all
contenders alike. The process's CPU time gives a second ratio (cpu_speedup_...), less moved
by a neighbour's load. Run it with the interpreter that has dalle-pytorch (generate_reference.py
says how to make one) and our sources on the path:

    .venv/bin/python bench/generate_side_by_side.py [--rotary_shift]

Contenders: 1.6.6's cached path in fp32; ours through the static KV cache, eager and
compiled (`generate --compile`), in fp32 and with the DALL-E cast to fp16 and bf16
(`generate --precision`); and per precision the matmul floor, one image's worth of the
model's linear layers on one row (no sampler at batch 1 reads fewer weight bytes). Same
config for all (bench/generate.py's, full attention); compile time is outside the rounds
(first_call_s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import comma_list, emit, require_positive, set_threads
from generate import bench_model, bench_vae, linear_pass
from generate_reference import reference_model, use_cache_path

from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.model.decoding import StaticDecoder


def contenders(args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    """name -> one batch-1 image, each with its own seeded generator stream."""
    cpu = torch.device("cpu")
    text = torch.randint(1, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    text[:, 16:] = 0
    reference = reference_model(args.rotary_shift)
    use_cache_path(reference, cached=True)
    found: dict[str, Callable[[], object]] = {
        "dalle_pytorch_cached_fp32": lambda: reference.generate_images(
            text, filter_thres=0.9, use_cache=True)}
    vae = bench_vae(cpu)
    for precision in args.precisions:
        model = bench_model("full", args.rotary_shift, precision, cpu)
        found[f"matmul_floor_{precision}"] = image_of_matmuls(model)
        for mode in args.modes:
            decoder = StaticDecoder(model, 1, compiled=mode == "compiled")
            generator = torch.Generator().manual_seed(0)
            found[f"ours_{mode}_{precision}"] = (
                lambda m=model, d=decoder, g=generator: m.generate_images(
                    text, vae, 0.9, 1.0, g, decoder=d))
    return found


def image_of_matmuls(model: torch.nn.Module) -> Callable[[], object]:
    """One image's worth of bench/generate.py's linear_pass: every linear layer once per
    image token on one row, the weight reads no batch-1 decoder can avoid (its matmul
    floor, here timed in the same turns as the samplers, so a ratio to it is not moved by
    drift)."""
    one_pass = linear_pass(model, 1, torch.device("cpu"))
    tokens = model.layout.image_len

    def run() -> None:
        for _ in range(tokens):
            one_pass()

    return run


#: --modes: our decode step as `generate` runs it, and with `generate --compile`
MODES = ("eager", "compiled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--rotary_shift", action="store_true",
                        help="rotary embeddings and shifted tokens in both models")
    args = parser.parse_args()
    require_positive(parser, args, "threads", "rounds")
    args.precisions = comma_list(parser, "--precisions", args.precisions, PRECISION_KINDS)
    args.modes = comma_list(parser, "--modes", args.modes, MODES)
    set_threads(args.threads)
    runs = contenders(args)
    import dalle_pytorch  # after contenders(): reference_model stubs its unused imports
    first: dict[str, float] = {}
    with torch.no_grad():
        for name, run in runs.items():  # warm-up: compiling, allocator, masks
            start = time.perf_counter()
            run()
            first[name] = time.perf_counter() - start
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        order = list(runs)
        for round_ in range(args.rounds):
            shift = round_ % len(order)
            for name in order[shift:] + order[:shift]:
                start, start_cpu = time.perf_counter(), time.process_time()
                runs[name]()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    reference = statistics.median(times["dalle_pytorch_cached_fp32"])
    reference_cpu = statistics.median(cpu["dalle_pytorch_cached_fp32"])
    results = {name: {"seconds_per_image_batch_1": round(statistics.median(t), 4),
                      "speedup_vs_dalle_pytorch_cached": round(
                          reference / statistics.median(t), 2),
                      "cpu_speedup_vs_dalle_pytorch_cached": round(
                          reference_cpu / statistics.median(cpu[name]), 2),
                      "spread": [round(min(t), 3), round(max(t), 3)],
                      "first_call_s": round(first[name], 2)}
               for name, t in times.items()}
    emit({"bench": "generate_side_by_side", "dalle_pytorch": dalle_pytorch.__version__,
          "threads": args.threads, "rounds": args.rounds, "image_tokens": 256,
          "pattern": "full", "rotary_shift": args.rotary_shift, "results": results})


if __name__ == "__main__":
    main()
