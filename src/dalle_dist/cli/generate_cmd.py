"""Flags of `generate`, as DALLE-pytorch's generate.py names them."""

from __future__ import annotations

import argparse

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.config_base import add_flags, from_args
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.generate import GenerateConfig


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="sample images from a trained DALL-E",
                       description="Sample images for one or more prompts ('|' separates "
                                   "prompts); writes PNGs and grid.png per prompt.")
    p.add_argument("--dalle_path", required=True, help="DALL-E checkpoint")
    p.add_argument("--text", required=True, help='prompt(s), e.g. "a small red circle on the '
                                                 'left|a large blue square at the top"')
    add_flags(p, GenerateConfig)
    add_flags(p.add_argument_group(
        "tokenizer (only for a checkpoint that carries none: otherwise they must name the "
        "one it carries)"), TokenizerConfig)
    p.add_argument("--outputs_dir", default="outputs", help="default %(default)s")
    add_flags(p, DistributedConfig, only=["device"])
    add_flags(p.add_argument_group(
        "VQGAN (optional: a DALL-E checkpoint carries its VQGAN; given, they must name it)"),
        TamingConfig)
    p.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from dalle_dist.backends import SingleBackend
    from dalle_dist.generate import generate, split_prompts

    config = from_args(GenerateConfig, args)
    device = SingleBackend.on(torch.device(args.device) if args.device else None).device
    grids = generate(args.dalle_path, split_prompts(args.text), args.outputs_dir, config, device,
                     tokenizer=from_args(TokenizerConfig, args),
                     taming=from_args(TamingConfig, args))
    for grid in grids:
        print(f"grid: {grid}")
    return 0
