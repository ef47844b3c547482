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

Resume start-up: the time to the first batch of an epoch resumed at 90% of its batches,
for WebDataset image shards (--wds_images JPEGs of 256 px read at 128 px) read three
ways: dropping the earlier batches undecoded (what a resume does), decoding and then
dropping them (what it did before), and from token shards of the same samples (the
sampler skips indices, reading nothing). Folder and shapes data seek as token shards do.
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
    parser.add_argument("--wds_images", type=int, default=1600,
                        help="WebDataset samples for the resume figure")
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
        result["resume_first_batch_s"] = resume_first_batch(folder, args.wds_images)
    emit(result)


def resume_first_batch(folder: Path, count: int) -> dict[str, float]:
    """Seconds to the first batch of an epoch resumed at 90% of its batches."""
    import io
    import itertools
    import tarfile
    import time

    import torch
    from PIL import Image

    from dalle_dist.data import CaptionCollate, EpochLoader
    from dalle_dist.data.token_shards import write_manifest, write_shard
    from dalle_dist.data.tokenizer import ByteTokenizer
    from dalle_dist.data.wds import WebDatasetLoader

    shards = folder / "wds"
    shards.mkdir()
    generator = torch.Generator().manual_seed(0)
    for s in range(2):
        with tarfile.open(shards / f"shard-{s}.tar", "w") as tar:
            for i in range(count // 2):
                pixels = torch.randint(256, (256, 256, 3), generator=generator,
                                       dtype=torch.uint8)
                jpeg = io.BytesIO()
                Image.fromarray(pixels.numpy()).save(jpeg, "JPEG", quality=90)
                for ext, data in (("jpg", jpeg.getvalue()), ("txt", f"image {s} {i}".encode())):
                    info = tarfile.TarInfo(f"{s}{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    batch = 16
    collate = CaptionCollate(ByteTokenizer(), 24, True)

    def wds() -> WebDatasetLoader:
        return WebDatasetLoader(str(shards), "jpg,txt", 128, 1.0, batch, 0, 1, 0, 0, collate,
                                True)

    steps = len(wds())
    start = steps * 9 // 10
    out: dict[str, float] = {"batches": steps, "resumed_at": start}
    began = time.perf_counter()
    next(wds().epoch(0, start))
    out["webdataset_skip_undecoded"] = round(time.perf_counter() - began, 3)
    began = time.perf_counter()
    next(itertools.islice(wds().epoch(0), start, None))
    out["webdataset_decode_then_drop"] = round(time.perf_counter() - began, 3)
    tokens = folder / "wds-tokens"
    write_shard(tokens / "shard-000000.safetensors", torch.zeros(count, 256, dtype=torch.long),
                [f"image {i}" for i in range(count)], [str(i) for i in range(count)], 1024,
                "bench", (0, count))
    write_manifest(tokens, {"encode_id": "bench", "image_tokenizer": {}, "source": {},
                            "samples": count, "shards": [{"name": "shard-000000.safetensors",
                                                          "start": 0, "samples": count}]})
    from dalle_dist.data.token_shards import TokenShards

    began = time.perf_counter()
    loader = EpochLoader(TokenShards(tokens), batch, 0, 1, 0, 0, collate)
    next(loader.epoch(0, start))
    out["token_shards"] = round(time.perf_counter() - began, 3)
    return out


if __name__ == "__main__":
    main()
