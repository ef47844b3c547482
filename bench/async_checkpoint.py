"""The step time while a sharded checkpoint is written: --async_checkpoint against the
blocking save, on 2 fsdp CPU ranks (docs/checkpoints.md, "Sharded checkpoints").

Run it plainly: it trains a tiny VAE once, then launches `dalle-dist train` with torchrun
(fsdp, 2 ranks, --checkpoint_format sharded, a save every --every steps, metrics every
step) once per mode, alternating the modes --rounds times, and prints one JSON object.

A step's time is the difference between two consecutive metrics lines' `time`: a save
after step k falls inside step k+1's interval (the loop logs step k, then saves). For each
mode: the median interval of the steps that follow a save (`with_save_s`), of the others
(`without_save_s`), and their difference (`save_cost_s`, what a save adds to a step).

    python bench/async_checkpoint.py [--dim 512 --depth 8] [--steps 24 --every 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit

BIN = Path(sys.executable).parent
VAE = ["--image_size", "16", "--num_layers", "2", "--num_tokens", "32", "--emb_dim", "16",
       "--hidden_dim", "16", "--num_resnet_blocks", "0"]


def run(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-3000:])


def intervals(metrics: Path, every: int) -> dict[str, Any]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    times = {r["step"]: r["time"] for r in records}
    after_save, other = [], []
    for step in sorted(times)[2:]:  # the first steps warm up (and the save before step 1)
        if step - 1 in times:
            (after_save if (step - 1) % every == 0 else other).append(times[step] - times[step - 1])
    return {"with_save_s": median(after_save), "without_save_s": median(other),
            "save_cost_s": median(after_save) - median(other), "saves": len(after_save)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        run([str(BIN / "dalle-dist"), "train-vae", *VAE, "--epochs", "1", "--batch_size", "16",
             "--shapes_count", "64", "--vae_output_file_name", "vae.pt"], folder, env)
        results: dict[str, list[dict[str, Any]]] = {"blocking": [], "async": []}
        for round_ in range(args.rounds):
            for mode in (("blocking", "async") if round_ % 2 == 0 else ("async", "blocking")):
                name = f"{mode}-{round_}"
                run([str(BIN / "torchrun"), "--nproc_per_node", "2", "-m", "dalle_dist",
                     "train", "--distributed_backend", "fsdp", "--checkpoint_format",
                     "sharded", *(["--async_checkpoint"] if mode == "async" else []),
                     "--vae_path", "vae.pt", "--dim", str(args.dim), "--depth", str(args.depth),
                     "--heads", "8", "--dim_head", "64", "--text_seq_len", "40",
                     "--batch_size", "8", "--shapes_count", str(8 * args.steps), "--epochs", "1",
                     "--save_every_n_steps", str(args.every), "--log_every_n_steps", "1",
                     "--sample_every_n_steps", "0", "--fidelity_images", "0",
                     "--dalle_output_file_name", name], folder, env)
                results[mode].append(intervals(folder / f"{name}.metrics.jsonl", args.every))
                state = folder / f"{name}-sharded"
                size = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
                results[mode][-1]["save_mb"] = round(size / 2**20, 1)
    summary = {mode: {key: round(median(r[key] for r in runs), 3)
                      for key in ("with_save_s", "without_save_s", "save_cost_s")}
               for mode, runs in results.items()}
    emit({"settings": vars(args), "runs": results, "median": summary,
          "async_save_cost_ratio": round(summary["async"]["save_cost_s"]
                                         / summary["blocking"]["save_cost_s"], 3)})


if __name__ == "__main__":
    main()
