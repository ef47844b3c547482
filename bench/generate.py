"""Sampling speed through the static KV cache, printed as JSON: seconds per image at batch 1
and images per second at batch 16, eager and with the decode step compiled (torch.compile
on CPU, CUDA graphs on CUDA), for each attention pattern, on the train_step bench's model
(dim 256, depth 4, 4 heads x 64, text 32, 16 x 16 = 256 image tokens; --rotary_shift adds
rotary embeddings and shifted tokens).
Untrained weights: sampling costs the same whatever the weights say. VAE decoding of the
tokens is included; compile time is not (it is reported on its own). Beside each batch-1
figure, the floor its matmuls alone set (every linear layer once per image token, as
matrix-vector products bound by reading the weights), and the share of the time they
take: what is left above it is the rest of the decode step. --precision bf16 / fp16 casts
the DALL-E as `generate --precision` does (half the bytes per step; the VAE stays fp32).

DALLE-pytorch 1.6.6 on the same config is timed by bench/generate_reference.py (run it
with an interpreter that has dalle-pytorch, in the same session); pass its JSON with
--reference to get the ratios; they are given only when both ran the same model (pattern
and --rotary_shift alike: those two cost 1.6.6 about 20% per image).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, median, set_threads

from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.model.decoding import StaticDecoder

PATTERN_NAMES = ("full", "axial_row", "axial_col", "conv_like", "sparse")


def bench_vae(device: torch.device) -> DiscreteVAE:
    torch.manual_seed(0)
    return DiscreteVAE(VAEConfig(image_size=64, num_tokens=512, num_layers=2)).to(device).eval()


def bench_model(pattern: str, rotary_shift: bool, precision: str, device: torch.device
                ) -> DALLE:
    """The bench's DALL-E, cast as `generate --precision` casts it."""
    cfg = DALLEConfig(num_text_tokens=1000, text_seq_len=32, num_image_tokens=512,
                      image_fmap_size=16, dim=256, depth=4, heads=4, dim_head=64,
                      attn_types=(pattern,), rotary_emb=rotary_shift, shift_tokens=rotary_shift)
    return DALLE(cfg).to(device=device, dtype=PRECISION_KINDS[precision].dtype).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(model: DALLE, vae: DiscreteVAE, batch: int, repeats: int, compiled: bool,
          device: torch.device) -> tuple[float, float]:
    """(median seconds of one generate_images call, seconds of the first call: warm-up,
    which includes compiling)."""
    text = torch.randint(1, 1000, (batch, model.config.text_seq_len), device=device)
    text[:, 16:] = 0
    generator = torch.Generator(device).manual_seed(0)
    decoder = StaticDecoder(model, batch, compiled=compiled)
    start = time.perf_counter()
    model.generate_images(text, vae, 0.9, 1.0, generator, decoder=decoder)
    sync(device)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate_images(text, vae, 0.9, 1.0, generator, decoder=decoder)
        sync(device)
        times.append(time.perf_counter() - start)
    return median(times), first


def linear_pass(model: DALLE, rows: int, device: torch.device) -> Callable[[], None]:
    """A function applying every linear layer of the model once to `rows` random rows of
    its input size and dtype: one decode step's matmuls, nothing else."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, m.in_features, device=device, dtype=m.weight.dtype)
              for m in layers]

    def one_pass() -> None:
        for layer, x in zip(layers, inputs, strict=True):
            torch.nn.functional.linear(x, layer.weight, layer.bias)

    return one_pass


def matmul_floor(model: DALLE, rows: int, repeats: int, device: torch.device) -> float:
    """Seconds per image of the decode steps' matmuls alone: every linear layer of the
    model applied once to `rows` rows, per image token, nothing else. At batch 1 these
    are matrix-vector products, bound by reading the weights from memory: no decode step
    can be faster than this without fewer or smaller weights (bf16 / fp16)."""
    one_pass = linear_pass(model, rows, device)
    with torch.no_grad():
        for _ in range(5):
            one_pass()
        times = []
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            for _ in range(32):
                one_pass()
            sync(device)
            times.append((time.perf_counter() - start) / 32)
    return median(times) * model.layout.image_len


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", default=",".join(PATTERN_NAMES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", default="eager,compiled",
                        help="comma-separated: eager (static cache), compiled (its step compiled)")
    parser.add_argument("--rotary_shift", action="store_true",
                        help="rotary embeddings and shifted tokens (DALLE-pytorch's class "
                             "defaults; default off, as its train_dalle.py and our config)")
    parser.add_argument("--precision", default="fp32", choices=list(PRECISION_KINDS),
                        help="the DALL-E's weights and cache, as generate --precision "
                             "(default fp32, what DALLE-pytorch samples in)")
    parser.add_argument("--reference", type=Path, default=None,
                        help="JSON of bench/generate_reference.py from the same session")
    args = parser.parse_args()
    set_threads(args.threads)
    device = torch.device(args.device)
    vae = bench_vae(device)
    reference = json.loads(args.reference.read_text()) if args.reference else None
    results = []
    for pattern in args.patterns.split(","):
        model = bench_model(pattern, args.rotary_shift, args.precision, device)
        for mode in args.modes.split(","):
            compiled = mode == "compiled"
            one, first_one = timed(model, vae, 1, args.repeats, compiled, device)
            sixteen, _ = timed(model, vae, 16, max(1, args.repeats - 1), compiled, device)
            floor = matmul_floor(model, 1, 5, device)
            row = {"pattern": pattern, "mode": mode,
                   "seconds_per_image_batch_1": round(one, 4),
                   "matmul_floor_seconds_per_image_batch_1": round(floor, 4),
                   "share_of_batch_1_in_matmuls": round(floor / one, 2),
                   "images_per_s_batch_16": round(16 / sixteen, 2),
                   "first_call_s_batch_1": round(first_one, 2)}
            if (reference is not None and pattern == reference.get("pattern")
                    and reference.get("rotary_shift", True) == args.rotary_shift):
                ref = reference["cached_seconds_per_image_batch_1"]
                row["speedup_vs_dalle_pytorch_cached_batch_1"] = round(ref / one, 2)
                ref16 = reference.get("cached_images_per_s_batch_16")
                if ref16:
                    row["speedup_vs_dalle_pytorch_cached_batch_16"] = round(
                        16 / sixteen / ref16, 2)
            results.append(row)
    emit({"bench": "generate", "device": str(device), "threads": args.threads,
          "image_tokens": 256, "rotary_shift": args.rotary_shift,
          "precision": args.precision, "reference": reference,
          "results": results})


if __name__ == "__main__":
    main()
