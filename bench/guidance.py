"""Classifier-free guidance on the built-in shapes, printed as JSON: caption fidelity
(data/scorer.py: colour and shape of held-out captions) at each --cond_scale, and the
sampling cost of each relative to cond_scale 1 (the doubled batch), for a DALL-E trained
with --null_cond_prob. The training run's validation curve (--val_fraction) is reported too.

Without --checkpoint it first trains one on the built-in shapes with TRAIN_FLAGS (dim 64,
depth 2, 2 epochs of 2,000 shapes, on the cached built-in VAE; minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, median, set_threads

from dalle_dist.data.tokenizer import tokenize
from dalle_dist.generate import Sampler, load_sampler
from dalle_dist.model.decoding import StaticDecoder
from dalle_dist.train.evaluate import evaluate_fidelity

#: A model small enough to train in minutes on a shared 2-core CPU.
TRAIN_FLAGS = ["--null_cond_prob", "0.1", "--val_fraction", "0.05", "--val_every_n_steps", "40",
               "--shapes_count", "2000", "--epochs", "2", "--batch_size", "16", "--dim", "64",
               "--depth", "2", "--heads", "2", "--dim_head", "32", "--log_every_n_steps", "20",
               "--sample_every_n_steps", "0", "--save_every_n_steps", "0",
               "--fidelity_images", "0"]


def train(out: Path) -> Path:
    checkpoint = out / "guided.pt"
    subprocess.run([sys.executable, "-m", "dalle_dist", "train", *TRAIN_FLAGS,
                    "--dalle_output_file_name", str(checkpoint)], check=True)
    return checkpoint


def curves(checkpoint: Path) -> dict[str, list[list[float]]]:
    """[step, value] of the training loss (per log window) and of the validation loss."""
    metrics = checkpoint.with_suffix(".metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {"val_loss": [[r["step"], round(r["val_loss"], 4)] for r in records
                         if "val_loss" in r],
            "train_loss": [[r["step"], round(r["loss"], 4)] for r in records if "loss" in r]}


def sampling_seconds(sampler: Sampler, scale: float, batch: int, repeats: int,
                     device: torch.device) -> float:
    """Median seconds of one batch through the static cache (VAE decode included)."""
    model = sampler.model
    text = tokenize(sampler.tokenizer, ["a small red circle on the left"] * batch,
                    model.config.text_seq_len, True).to(device)
    decoder = StaticDecoder(model, batch, cond_scale=scale)
    generator = torch.Generator(device).manual_seed(0)
    times = []
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        model.generate_images(text, sampler.vae, 0.9, 1.0, generator, decoder=decoder)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if attempt:  # the first call warms the allocator
            times.append(time.perf_counter() - start)
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a DALL-E trained with --null_cond_prob (default: train one)")
    parser.add_argument("--out", type=Path, default=Path("bench-guidance"))
    parser.add_argument("--scales", default="1,3")
    parser.add_argument("--images", type=int, default=128, help="captions scored per scale")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    set_threads(args.threads)
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint or train(args.out)
    sampler = load_sampler(checkpoint, device)
    data_seed = 0  # the built-in shapes' default --shapes_seed
    results, base = [], None
    for scale in (float(s) for s in args.scales.split(",")):
        fidelity = evaluate_fidelity(sampler.model, sampler.vae, sampler.tokenizer,
                                     args.images, data_seed, device, cond_scale=scale)
        seconds = sampling_seconds(sampler, scale, args.batch, args.repeats, device)
        base = seconds if base is None else base
        results.append({"cond_scale": scale, "fidelity": round(fidelity.score, 4),
                        "images": args.images,
                        "seconds_per_batch": round(seconds, 3), "batch": args.batch,
                        "cost_vs_first_scale": round(seconds / base, 2)})
    emit({"bench": "guidance", "device": str(device), "threads": args.threads,
          "checkpoint": str(checkpoint),
          "null_cond_prob": sampler.model.config.null_cond_prob,
          "results": results, **curves(checkpoint)})


if __name__ == "__main__":
    main()
