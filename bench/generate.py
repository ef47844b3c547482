"""Sampling speed with the KV cache, printed as JSON: seconds per image at batch 1 and
images per second at batch 16, for each attention pattern, on the train_step bench's
model (dim 256, depth 4, 4 heads x 64, text 32, 16 x 16 = 256 image tokens), 2 threads.
Untrained weights: sampling costs the same whatever the weights say. VAE decoding of the
tokens is included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, median, set_threads

from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig

PATTERN_NAMES = ("full", "axial_row", "axial_col", "conv_like", "sparse")


def seconds(model: DALLE, vae: DiscreteVAE, batch: int, repeats: int) -> float:
    text = torch.randint(1, 1000, (batch, model.config.text_seq_len))
    text[:, 16:] = 0
    generator = torch.Generator().manual_seed(0)
    model.generate_images(text, vae, 0.9, 1.0, generator)  # warm-up: masks, allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate_images(text, vae, 0.9, 1.0, generator)
        times.append(time.perf_counter() - start)
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", default=",".join(PATTERN_NAMES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    vae = DiscreteVAE(VAEConfig(image_size=64, num_tokens=512, num_layers=2)).eval()
    results = []
    for pattern in args.patterns.split(","):
        cfg = DALLEConfig(num_text_tokens=1000, text_seq_len=32, num_image_tokens=512,
                          image_fmap_size=16, dim=256, depth=4, heads=4, dim_head=64,
                          attn_types=(pattern,))
        model = DALLE(cfg).eval()
        one = seconds(model, vae, 1, args.repeats)
        sixteen = seconds(model, vae, 16, max(1, args.repeats - 1))
        results.append({"pattern": pattern, "seconds_per_image_batch_1": round(one, 3),
                        "images_per_s_batch_16": round(16 / sixteen, 2)})
    emit({"bench": "generate", "threads": args.threads, "image_tokens": 256,
          "results": results})


if __name__ == "__main__":
    main()
