"""Training throughput of DALL-E on one process, printed as JSON.

Default config (the foundation issue's): DALLE dim 256, depth 4, heads 4, dim_head 64,
text_seq_len 32, 1000 text tokens; VAE image_size 64, num_layers 2, num_tokens 512
(16x16 = 256 image tokens); batch 8, fp32, 2 threads. A step = VAE encoding of the batch
(no grad, as DALLE-pytorch does inside forward) + forward + backward + clip + Adam step.

MFU counts the matmul FLOPs of the transformer and the output projection only
(dalle_dist.selftest.mfu.training_flops_per_step, which `dalle-dist selftest` uses too):
  per token and layer, forward: 2 * (4*d*inner + 3*ff_mult*d*d)      (qkv + out; GEGLU in/out)
                                + 2 * 2 * n * inner                  (QK^T and AV over n keys)
  per token, forward, logits:   2 * d * vocab_of_its_position
  training = 3 x forward (backward costs twice the forward).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    add_model_size_args,
    comma_list,
    emit,
    keep_train_heap,
    matmul_peak_flops,
    median,
    peak_rss_mb,
    require_positive,
    set_threads,
    square_tokens,
    time_steps,
)

from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.model.attention import ATTN_IMPLS
from dalle_dist.model.patterns import PATTERNS
from dalle_dist.selftest.mfu import training_flops_per_step
from dalle_dist.train.compile import compile_blocks
from dalle_dist.train.config import OptimizerConfig
from dalle_dist.train.optim import embedding_weights, make_adam, make_optimizer
from dalle_dist.train.schedule import make_lr_scheduler

#: lucidrains/DALLE-pytorch 1.6.6 on this machine, same config (256 image tokens), per
#: attention pattern, as measured for issues #2 and #4 (its sparse needs DeepSpeed's kernel,
#: which DeepSpeed >= 0.19.7 no longer has).
REFERENCE_SAMPLES_PER_S = {"full": 13.4, "axial_row": 14.5, "axial_col": 14.9,
                           "conv_like": 5.5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    add_model_size_args(parser)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--num_tokens", type=int, default=512)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--attn_types", default="full",
                        help="comma list cycled over the layers (default full)")
    parser.add_argument("--attn_impl", default="auto", choices=ATTN_IMPLS)
    parser.add_argument("--image_tokens", type=int, default=None,
                        help="256 or 1024 (sets --image_size for the 2-layer VAE)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each transformer block (compile time not counted)")
    parser.add_argument("--optimizer", choices=("adam", "adamw"), default="adam",
                        help="adamw: train's --optimizer adamw --weight_decay 0.05 (its two "
                        "param groups) with a warmup + cosine LambdaLR stepped every step, as "
                        "train --lr_schedule cosine steps it (default adam, constant rate)")
    args = parser.parse_args()
    require_positive(parser, args, "batch", "threads", "steps", "image_size", "num_tokens",
                     "num_layers")
    attn_types = comma_list(parser, "--attn_types", args.attn_types, PATTERNS)
    if args.image_tokens is not None:
        side = math.isqrt(square_tokens(parser, "--image_tokens", args.image_tokens))
        args.image_size = side * 2**args.num_layers

    set_threads(args.threads)
    torch.manual_seed(0)
    vae = DiscreteVAE(VAEConfig(image_size=args.image_size, num_tokens=args.num_tokens,
                                num_layers=args.num_layers)).eval()
    cfg = DALLEConfig(num_text_tokens=args.num_text_tokens, text_seq_len=args.text_seq_len,
                      num_image_tokens=args.num_tokens, image_fmap_size=vae.config.fmap_size,
                      dim=args.dim, depth=args.depth, heads=args.heads, dim_head=args.dim_head,
                      attn_types=tuple(attn_types))
    model = DALLE(cfg, args.attn_impl)
    if args.compile:  # as train --compile does (its compile happens in the warm-up)
        compile_blocks(model.transformer)
    scheduler = None
    if args.optimizer == "adam":
        optimizer = make_adam(model.parameters(), lr=3e-4)
    else:
        optim = OptimizerConfig(optimizer="adamw", weight_decay=0.05, lr_schedule="cosine",
                                warmup_steps=args.warmup).resolved(False, 3e-4)
        optimizer = make_optimizer(model.parameters(), "adamw", 3e-4, optim.betas, 0.05,
                                   {id(p): n for n, p in model.named_parameters()},
                                   embedding_weights(model))
        scheduler = make_lr_scheduler(optimizer, optim, 3e-4, args.warmup + args.steps)
    text = torch.randint(1, args.num_text_tokens, (args.batch, args.text_seq_len))
    text[:, args.text_seq_len // 2:] = 0  # half padding, like real captions
    images = torch.rand(args.batch, 3, args.image_size, args.image_size)

    def step() -> None:
        image_tokens = vae.get_codebook_indices(images)
        loss = model(text, image_tokens)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()

    heap_kept = keep_train_heap()
    times = time_steps(step, args.warmup, args.steps)
    step_s = median(times)
    peak = matmul_peak_flops()
    flops = training_flops_per_step(cfg, args.batch)
    samples_per_s = args.batch / step_s
    emit({
        "bench": "train_step",
        "config": vars(args),
        "parameters": sum(p.numel() for p in model.parameters()),
        "samples_per_s": round(samples_per_s, 2),
        "median_step_s": round(step_s, 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "heap_kept": heap_kept,
        "flops_per_step": flops,
        "achieved_gflops": round(flops / step_s / 1e9, 1),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "mfu": round(flops / step_s / peak, 3),
        **reference(args, samples_per_s),
    })


def reference(args: argparse.Namespace, samples_per_s: float) -> dict:
    """DALLE-pytorch's figure for this run, where one was measured (one pattern, 256 tokens)."""
    known = REFERENCE_SAMPLES_PER_S.get(args.attn_types)
    if known is None or vae_tokens(args) != 256 or args.batch != 8:
        return {}
    return {"reference_samples_per_s": known,
            "speedup_vs_reference": round(samples_per_s / known, 2)}


def vae_tokens(args: argparse.Namespace) -> int:
    return (args.image_size // 2**args.num_layers) ** 2


if __name__ == "__main__":
    main()
