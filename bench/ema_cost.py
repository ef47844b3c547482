"""The step-time cost of `train --ema_decay` on 2 CPU ranks (torchrun), printed as JSON.

Runs `train` with and without --ema_decay in turns (A, B, A, B, ...), each on the
built-in shapes with the bench model (dim 256, depth 4, 4 x 64 heads, text 32) over
--backend (torch DDP by default, or fsdp: the EMA is then sharded), and compares the
samples/s its metrics log (--log_every_n_steps 5, the first window left out: it holds
the first step's set-up). No sample grids: they would time the EMA swap, not the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = ["--dim", "256", "--depth", "4", "--heads", "4", "--dim_head", "64",
         "--text_seq_len", "32", "--truncate_captions"]


def run_once(backend: str, ema: bool, steps: int, folder: Path) -> float:
    """Median samples/s of one run's logged windows after the first."""
    batch = 16
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "-m", "dalle_dist", "train", *MODEL, "--distributed_backend", backend,
           "--batch_size", str(batch), "--shapes_count", str(steps * batch), "--epochs", "1",
           "--fidelity_images", "0", "--log_every_n_steps", "5", "--save_every_n_steps", "0",
           "--dalle_output_file_name", "run", "--overwrite",
           *(["--ema_decay", "0.999"] if ema else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-2000:])
    records = [json.loads(line) for line in (folder / "run.metrics.jsonl").read_text()
               .splitlines()]
    speeds = [r["samples_per_s"] for r in records if "samples_per_s" in r][1:]
    return statistics.median(speeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=("torch", "fsdp"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    plain, with_ema = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            plain.append(run_once(args.backend, False, args.steps, Path(tmp)))
            with_ema.append(run_once(args.backend, True, args.steps, Path(tmp)))
    ratio = statistics.median(with_ema) / statistics.median(plain)
    print(json.dumps({"backend": args.backend, "ranks": 2, "steps": args.steps,
                      "samples_per_s_without": plain, "samples_per_s_with_ema": with_ema,
                      "ema_over_plain": round(ratio, 3)}, indent=2))


if __name__ == "__main__":
    main()
