"""Flags of `generate`, as DALLE-pytorch's generate.py names them."""

from __future__ import annotations

import argparse

from dalle_dist.generate import GenerateConfig

_GEN = GenerateConfig()


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="sample images from a trained DALL-E",
                       description="Sample images for one or more prompts ('|' separates "
                                   "prompts); writes PNGs and grid.png per prompt.")
    p.add_argument("--dalle_path", required=True, help="DALL-E checkpoint")
    p.add_argument("--text", required=True, help='prompt(s), e.g. "a small red circle on the '
                                                 'left|a large blue square at the top"')
    p.add_argument("--num_images", type=int, default=_GEN.num_images,
                   help="images per prompt (default %(default)s)")
    p.add_argument("--batch_size", type=int, default=_GEN.batch_size,
                   help="images sampled at once (default %(default)s)")
    p.add_argument("--top_k", type=float, default=_GEN.top_k,
                   help="filter threshold: keep the best (1 - top_k) of image tokens "
                        "(default %(default)s)")
    p.add_argument("--temperature", type=float, default=_GEN.temperature,
                   help="default %(default)s")
    p.add_argument("--outputs_dir", default="outputs", help="default %(default)s")
    p.add_argument("--seed", type=int, default=None, help="for repeatable samples")
    p.add_argument("--truncate_captions", action="store_true",
                   help="cut prompts longer than the model's text length instead of stopping")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: auto)")
    p.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from dalle_dist.backends import SingleBackend
    from dalle_dist.generate import generate, split_prompts

    config = GenerateConfig(num_images=args.num_images, batch_size=args.batch_size,
                            top_k=args.top_k, temperature=args.temperature, seed=args.seed,
                            truncate_captions=args.truncate_captions)
    device = SingleBackend.on(torch.device(args.device) if args.device else None).device
    grids = generate(args.dalle_path, split_prompts(args.text), args.outputs_dir, config, device)
    for grid in grids:
        print(f"grid: {grid}")
    return 0
