"""Training from token shards (`train --token_shards`) against training from the same
images, and `encode`'s own speed. Prints JSON.

For each image size (--sizes, default 64 and 128 px, built-in shapes) it trains a VAE for
one step (its size, not its quality, sets the encode's cost: DALLE-pytorch's usual
3-halving VAE), encodes the shapes once, then trains the same small DALL-E from the images
and from the shards on 1 process and on 2 torchrun ranks (torch DDP), the two taking
turns for --rounds rounds. A run's speed is the median of its logged `samples_per_s`
(one record per step) after the first --warmup steps; the ratio is tokens / images of the
medians over rounds. Both read the same samples in the same order (the runs are equal
bit for bit: tests/backends/test_token_shards.py).

Resume start-up is not measured: folder, shapes and token shard data sets are read by
index and seek (the sampler skips indices, reading nothing); only WebDataset image shards
replay, and encode does not read them yet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit

PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
VAE = ["--num_layers", "3", "--num_tokens", "1024", "--emb_dim", "256", "--hidden_dim", "64",
       "--num_resnet_blocks", "1"]
DALLE = ["--dim", "256", "--depth", "4", "--heads", "4", "--dim_head", "64",
         "--text_seq_len", "48", "--fidelity_images", "0", "--sample_every_n_steps", "0",
         "--log_every_n_steps", "1", "--epochs", "1"]


def run(cmd: list[str], cwd: Path, threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def samples_per_s(metrics: Path, warmup: int) -> float:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if "samples_per_s" in r][warmup:]
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,128", help="image sizes in px")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    result: dict[str, Any] = {"settings": vars(args), "vae": VAE, "dalle": DALLE, "runs": {}}
    count = args.steps * args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for size in (int(s) for s in args.sizes.split(",")):
            vae = folder / f"vae{size}.pt"
            run([PYTHON, "-m", "dalle_dist", "train-vae", "--image_size", str(size), *VAE,
                 "--epochs", "1", "--batch_size", "16", "--shapes_count", "16",
                 "--vae_output_file_name", str(vae)], folder, 2)
            tokens = folder / f"tokens{size}"
            log = run([PYTHON, "-m", "dalle_dist", "encode", "--vae_path", str(vae),
                       "--shapes_count", str(count), "--output", str(tokens)], folder, 2)
            rate = re.search(r"\(([\d.]+) img/s\)", log)
            result["runs"][f"encode@{size}"] = float(rate.group(1)) if rate else None
            for ranks in (1, 2):
                speeds: dict[str, list[float]] = {"images": [], "tokens": []}
                for round_ in range(args.rounds):
                    order = ("images", "tokens") if round_ % 2 == 0 else ("tokens", "images")
                    for source in order:
                        data = (["--shapes_count", str(count)] if source == "images" else
                                ["--token_shards", str(tokens)])
                        out = folder / f"{source}{size}-{ranks}-{round_}"
                        flags = ["train", "--vae_path", str(vae), *DALLE, *data,
                                 "--batch_size", str(args.batch_size),
                                 "--dalle_output_file_name", str(out)]
                        cmd = ([PYTHON, "-m", "dalle_dist", *flags] if ranks == 1 else
                               [TORCHRUN, "--nproc_per_node", "2", "-m", "dalle_dist", *flags,
                                "--distributed_backend", "torch"])
                        run(cmd, folder, 2 if ranks == 1 else 1)
                        speeds[source].append(samples_per_s(
                            out.with_suffix(".metrics.jsonl"), args.warmup))
                medians = {k: statistics.median(v) for k, v in speeds.items()}
                result["runs"][f"train@{size}px x {ranks} rank(s)"] = {
                    "images_samples_per_s": round(medians["images"], 2),
                    "tokens_samples_per_s": round(medians["tokens"], 2),
                    "ratio": round(medians["tokens"] / medians["images"], 3),
                    "rounds": {k: [round(x, 2) for x in v] for k, v in speeds.items()}}
    emit(result)


if __name__ == "__main__":
    main()
