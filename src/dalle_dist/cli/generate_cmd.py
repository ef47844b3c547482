"""Flags of `generate`, as DALLE-pytorch's generate.py names them."""

from __future__ import annotations

import argparse

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.config_base import add_flags, from_args
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.generate import GenerateConfig, GenerateJob, PromptsConfig
from dalle_dist.model.config import ComputeConfig


def add_generate(p: argparse.ArgumentParser) -> None:
    p.description = ("Sample images for one or more prompts ('|' separates "
                     "prompts); writes PNGs and grid.png per prompt.")
    add_flags(p, PromptsConfig, only=["dalle_path", "text"])
    add_flags(p, GenerateConfig)
    add_flags(p.add_argument_group(
        "tokenizer (only for a checkpoint that carries none: otherwise they must name the "
        "one it carries)"), TokenizerConfig)
    add_flags(p, PromptsConfig, only=["outputs_dir"])
    add_flags(p, DistributedConfig, only=["device"])
    add_flags(p, ComputeConfig, only=["no_tf32"])
    add_flags(p.add_argument_group(
        "VQGAN (optional: a DALL-E checkpoint carries its VQGAN; given, they must name it)"),
        TamingConfig)
    p.set_defaults(run=run_generate)


def generate_job(args: argparse.Namespace) -> GenerateJob:
    """The parsed flags of `generate` as one job."""
    return GenerateJob(prompts=from_args(PromptsConfig, args),
                       sampling=from_args(GenerateConfig, args),
                       tokenizer=from_args(TokenizerConfig, args),
                       taming=from_args(TamingConfig, args), device=args.device,
                       no_tf32=args.no_tf32)


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from dalle_dist.backends import SingleBackend
    from dalle_dist.generate import generate, split_prompts

    job = generate_job(args)
    job.validate()
    device = SingleBackend.on(torch.device(job.device) if job.device else None).device
    grids = generate(job.prompts.dalle_path, split_prompts(job.prompts.text),
                     job.prompts.outputs_dir, job.sampling, device, tokenizer=job.tokenizer,
                     taming=job.taming, tf32=not job.no_tf32)
    for grid in grids:
        print(f"grid: {grid}")
    return 0
