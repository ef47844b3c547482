"""Host memory of each rank while FSDP2 or ZeRO-3 takes the model: built whole, or on the
meta device with its values streamed in (docs/design.md, "Construction").

Run it plainly: it launches itself on --ranks CPU ranks (torchrun for fsdp, the deepspeed
launcher for zero3), once per way of building, and prints one JSON object. Each rank
reports its peak resident memory (VmHWM) before the model exists and after `distribute`
returned, and its live memory after (malloc_trim first, so freed heap is not counted).

    built  the model built on the CPU with its values, then handed to the backend whole
           (what every rank did before the meta-device construction)
    meta   built on the meta device; the backend fills only this rank's shards

    python bench/startup_memory.py [--backend fsdp|zero3] [--ranks 2] [--dim 1024 --depth 8]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_model_size_args, emit

BIN = Path(sys.executable).parent
LAUNCHERS = {"fsdp": [str(BIN / "torchrun"), "--nproc_per_node"],
             "zero3": [str(BIN / "deepspeed"), "--num_gpus"]}


def memory_mb() -> dict[str, float]:
    """This process's peak and current resident memory, MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if line.startswith(("VmHWM", "VmRSS")))
    return {key: int(value.split()[0]) / 1024 for key, value in fields.items()}


def worker(args: argparse.Namespace) -> None:
    import torch

    from dalle_dist.backends import DistributedConfig
    from dalle_dist.backends.registry import backend_from_config
    from dalle_dist.model import DALLE, DALLEConfig
    from dalle_dist.model.init import initial_weights, materialise, on_meta
    from dalle_dist.train.optim import make_adam

    torch.set_num_threads(1)
    backend = backend_from_config(DistributedConfig(
        backend="fsdp" if args.backend == "fsdp" else "deepspeed",
        zero_stage=3 if args.backend == "zero3" else 0))
    backend.initialize()
    backend.check_config(backend.world_size)
    config = DALLEConfig(num_text_tokens=args.num_text_tokens, text_seq_len=args.text_seq_len,
                         num_image_tokens=1024, image_fmap_size=16, dim=args.dim,
                         depth=args.depth, heads=args.heads, dim_head=args.dim_head)
    if args.backend == "fsdp":  # imported before the baseline, as train has by then
        import torch.distributed.fsdp
    else:
        import deepspeed  # noqa: F401
    before = memory_mb()
    model = on_meta(lambda: DALLE(config))
    n_params = sum(p.numel() for p in model.parameters())
    weights = initial_weights(model, 0)
    if args.worker == "built":
        materialise(model, weights)
        weights = None
    backend.distribute(model, lambda params: make_adam(params, 1e-4), lambda _: None,
                       shard_units=list(model.transformer.blocks), weights=weights)
    after = memory_mb()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    line = {"rank": backend.rank, "params": n_params, "peak_before_mb": before["VmHWM"],
            "peak_after_mb": after["VmHWM"], "live_after_mb": memory_mb()["VmRSS"]}
    print("RESULT " + json.dumps(line), flush=True)
    backend.shutdown()
    sys.stdout.flush()
    os._exit(0)


def launch(way: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    cmd = [*LAUNCHERS[args.backend], str(args.ranks), str(Path(__file__).resolve()),
           "--worker", way, "--backend", args.backend,
           *[f"--{k}={getattr(args, k)}" for k in ("dim", "depth", "heads", "dim_head",
                                                    "text_seq_len", "num_text_tokens")]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                          timeout=args.timeout)
    output = done.stdout + done.stderr
    ranks = [json.loads(line[line.index("RESULT ") + 7:]) for line in output.splitlines()
             if "RESULT " in line]
    if done.returncode or len(ranks) != args.ranks:
        raise SystemExit(f"{way}: exit {done.returncode}\n{output[-3000:]}")
    return sorted(ranks, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(LAUNCHERS), default="fsdp")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker", choices=["built", "meta"], help=argparse.SUPPRESS)
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # deepspeed's
    add_model_size_args(parser)
    parser.set_defaults(dim=1024, depth=8, heads=16, dim_head=64)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    runs = {way: launch(way, args) for way in ("built", "meta")}
    params = runs["meta"][0]["params"]
    emit({"backend": args.backend, "ranks": args.ranks, "params": params,
          "fp32_model_mb": round(params * 4 / 2**20, 1),
          **{way: [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()}
                   for r in ranks] for way, ranks in runs.items()},
          "peak_growth_mb": {way: round(max(r["peak_after_mb"] - r["peak_before_mb"]
                                            for r in ranks), 1)
                             for way, ranks in runs.items()}})


if __name__ == "__main__":
    main()
