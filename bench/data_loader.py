"""Images per second the training loader delivers from an image-text folder, against the
images per second the trainer consumes, printed as JSON.

A temporary folder of --images pictures (half PNG, half JPEG, --source_size px, so every
item is decoded, randomly cropped and resized as in training) with .txt captions is read
through the trainer's own loader (data.EpochLoader over data.TextImageFolder, captions
tokenized in the collate) at each --sizes with each --workers count. Each run reads one
epoch to start the workers and fill their queues, then times --epochs epochs (the
persistent workers carry over). The trainer's rate is bench/train_step.py's samples/s at
the same image size (its default DALL-E, a 2-layer VAE: 64px -> 256 image tokens, 128px
-> 1024), run in its own process with the same thread count.

The loader keeps up when images_per_s / trainer_samples_per_s is above 1; on CUDA the
trainer is many times faster than on CPU, which is what the workers' default is for.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, set_threads

from dalle_dist.data import CaptionCollate, EpochLoader, TextImageFolder
from dalle_dist.data.loader import usable_cpus
from dalle_dist.data.tokenizer import ByteTokenizer

WORDS = ("red", "green", "blue", "small", "large", "circle", "square", "left", "right", "top")


def write_folder(root: Path, count: int, size: int) -> None:
    """`count` smooth random pictures with one- or two-line captions."""
    rng = np.random.default_rng(0)
    for i in range(count):
        low = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
        image = Image.fromarray(low).resize((size, size), Image.Resampling.BICUBIC)
        if i % 2:
            image.save(root / f"{i:05d}.jpg", quality=90)
        else:
            image.save(root / f"{i:05d}.png")
        lines = [" ".join(rng.choice(WORDS, 6)) for _ in range(1 + i % 2)]
        (root / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")


def loader_rate(root: Path, image_size: int, workers: int, batch: int, epochs: int
                ) -> dict[str, float]:
    dataset = TextImageFolder(root, image_size)
    loader = EpochLoader(dataset, batch, 0, 1, seed=0, num_workers=workers,
                         collate=CaptionCollate(ByteTokenizer(), 64, True))
    start = time.perf_counter()
    first = sum(len(images) for images, _, _ in loader.epoch(0))
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    seen = sum(len(images) for e in range(1, 1 + epochs) for images, _, _ in loader.epoch(e))
    steady_s = time.perf_counter() - start
    del loader  # ends the persistent workers before the next run
    return {"images_per_s": round(seen / steady_s, 1),
            "first_epoch_images_per_s": round(first / first_s, 1)}


def trainer_rate(image_size: int, batch: int, threads: int, steps: int) -> float:
    """bench/train_step.py's samples/s at this image size, in its own process."""
    script = Path(__file__).resolve().parent / "train_step.py"
    done = subprocess.run([sys.executable, str(script), "--image_size", str(image_size),
                           "--batch", str(batch), "--threads", str(threads),
                           "--steps", str(steps), "--warmup", "1"],
                          capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)["samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--source_size", type=int, default=256)
    parser.add_argument("--sizes", default="64,128")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--batch", type=int, default=8, help="as bench/train_step.py's")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trainer_steps", type=int, default=5,
                        help="timed steps of bench/train_step.py (0: skip the trainer)")
    args = parser.parse_args()
    set_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    worker_counts = [int(w) for w in args.workers.split(",")]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_folder(root, args.images, args.source_size)
        for size in sizes:
            for workers in worker_counts:
                rows.append({"image_size": size, "workers": workers,
                             **loader_rate(root, size, workers, args.batch, args.epochs)})
    trainer = {size: trainer_rate(size, args.batch, args.threads, args.trainer_steps)
               for size in sizes} if args.trainer_steps else {}
    for row in rows:
        if row["image_size"] in trainer:
            row["trainer_samples_per_s"] = trainer[row["image_size"]]
            row["loader_over_trainer"] = round(row["images_per_s"] / trainer[row["image_size"]],
                                               1)
    emit({"bench": "data_loader", "config": vars(args), "cpus": usable_cpus(),
          "torch": torch.__version__, "runs": rows})


if __name__ == "__main__":
    main()
