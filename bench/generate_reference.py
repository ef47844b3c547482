"""lucidrains/DALLE-pytorch 1.6.6's sampling speed on bench/generate.py's config, as JSON.

Run it with an interpreter that has `dalle-pytorch==1.6.6` (its dependencies beyond torch
and einops are not needed; `make test` installs it in .venv with `--no-deps`, beside
rotary-embedding-torch and axial_positional_embedding: Makefile), in the same session as
bench/generate.py, so the two numbers share the machine's load:

    .venv/bin/python bench/generate_reference.py

Two paths are timed:
  as_shipped  `generate_images(..., use_cache=True)`: at cond_scale 1 (the default) 1.6.6's
              forward_with_cond_scale drops the cache argument, so every token re-runs the
              whole sequence; this is what its generate.py does.
  cached      the same loop with the cache handed to forward, i.e. its KV-cache code path
              (what the cache was written for; issue 13 compares against this one).
Same model as ours: dim 256, depth 4, 4 heads x 64, text 32 of 1000 tokens, VAE 64 px with
2 layers and 512 tokens (16 x 16 = 256 image tokens), full attention, learned positions and no
token shift (its train_dalle.py's defaults and our DALLEConfig's; --rotary_shift turns on
rotary embeddings and shifted tokens, its DALLE class's defaults, for the same flag of
bench/generate.py). Untrained weights; VAE decoding included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, median, set_threads


def stub_unused_imports() -> None:
    """1.6.6 imports omegaconf, taming and pkg_resources at module level for what this
    bench never builds: the tests' loader (tests/checkpoint/dalle_pytorch_reference.py)
    gives it empty stand-ins and checks the version."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.checkpoint.dalle_pytorch_reference import dalle_pytorch

    dalle_pytorch()


def use_cache_path(model: torch.nn.Module, cached: bool) -> None:
    """cached: hand 1.6.6's forward the cache its sampling loop builds (at cond_scale 1
    its forward_with_cond_scale drops it); else restore what it ships."""
    if cached:
        def with_cache(*args: object, cond_scale: float = 1.0, cache: dict | None = None,
                       **kwargs: object) -> torch.Tensor:
            return model(*args, cache=cache, **kwargs)
        model.forward_with_cond_scale = with_cache
    else:
        model.__dict__.pop("forward_with_cond_scale", None)


def reference_model(rotary_shift: bool) -> torch.nn.Module:
    """1.6.6's DALLE (with its VAE) on bench/generate.py's config, seeded, in eval mode."""
    stub_unused_imports()
    from dalle_pytorch import DALLE, DiscreteVAE

    torch.manual_seed(0)
    vae = DiscreteVAE(image_size=64, num_layers=2, num_tokens=512).eval()
    return DALLE(dim=256, vae=vae, num_text_tokens=1000, text_seq_len=32, depth=4, heads=4,
                 dim_head=64, attn_types=("full",), rotary_emb=rotary_shift,
                 shift_tokens=rotary_shift).eval()


def seconds(model: torch.nn.Module, text: torch.Tensor, repeats: int, cached: bool) -> float:
    use_cache_path(model, cached)
    with torch.no_grad():
        model.generate_images(text, filter_thres=0.9, use_cache=True)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.generate_images(text, filter_thres=0.9, use_cache=True)
            times.append(time.perf_counter() - start)
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip_as_shipped", action="store_true",
                        help="time only the cached path (as_shipped takes minutes)")
    parser.add_argument("--rotary_shift", action="store_true",
                        help="1.6.6's class defaults, rotary embeddings and shifted tokens "
                             "(default: off, as its train_dalle.py and bench/generate.py)")
    parser.add_argument("--batches", default="1,16",
                        help="comma-separated batch sizes (16 takes minutes on 2 busy cores)")
    args = parser.parse_args()
    set_threads(args.threads)
    model = reference_model(args.rotary_shift)
    import dalle_pytorch
    results = {}
    for batch in (int(b) for b in args.batches.split(",")):
        text = torch.randint(1, 1000, (batch, 32))
        text[:, 16:] = 0
        paths = ("cached",) if args.skip_as_shipped or batch > 1 else ("cached", "as_shipped")
        for path in paths:
            s = seconds(model, text, args.repeats if batch == 1 else max(1, args.repeats - 1),
                        path == "cached")
            key = (f"{path}_seconds_per_image_batch_1" if batch == 1
                   else f"{path}_images_per_s_batch_16")
            results[key] = round(s, 3) if batch == 1 else round(batch / s, 2)
    emit({"bench": "generate_reference", "dalle_pytorch": dalle_pytorch.__version__,
          "threads": args.threads, "image_tokens": 256, "pattern": "full",
          "rotary_shift": args.rotary_shift, **results})


if __name__ == "__main__":
    main()
