"""`train-vae` and `train`: typed configs in, a trained checkpoint out.

Each function checks everything that can be checked (configs, output paths, data, the
VAE and the tokenizer) before the first step, then hands one Task to the training loop.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from dalle_dist.backends import DistributedBackend
from dalle_dist.data import (
    CaptionCollate,
    DataConfig,
    build_dataset,
    check_captions,
    describe_dataset,
)
from dalle_dist.data.images import make_grid, save_png
from dalle_dist.data.tokenizer import load_tokenizer
from dalle_dist.errors import ConfigError, DataError
from dalle_dist.fileio import ensure_writable_file
from dalle_dist.model import DALLEConfig, VAEConfig, build_pattern
from dalle_dist.train.builtin_vae import builtin_vae
from dalle_dist.train.checkpoint import (
    dalle_parts,
    load_checkpoint,
    restore_rng,
    vae_from_checkpoint,
)
from dalle_dist.train.config import RunPaths, TrainConfig, VAESchedule
from dalle_dist.train.dalle_task import DALLETask
from dalle_dist.train.evaluate import evaluate_fidelity
from dalle_dist.train.loop import LoopState, train
from dalle_dist.train.run_log import RunLog
from dalle_dist.train.vae_task import VAETask


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_loader(dataset: Dataset, train_cfg: TrainConfig, data_cfg: DataConfig,
                collate: CaptionCollate) -> DataLoader:
    if len(dataset) < train_cfg.batch_size:
        raise DataError(f"the dataset has {len(dataset)} items, fewer than --batch_size "
                        f"{train_cfg.batch_size}", "lower --batch_size or add data")
    generator = torch.Generator().manual_seed(train_cfg.seed)
    return DataLoader(dataset, batch_size=train_cfg.batch_size, shuffle=True, drop_last=True,
                      num_workers=data_cfg.num_workers, collate_fn=collate,
                      generator=generator, persistent_workers=data_cfg.num_workers > 0)


def train_vae(vae_cfg: VAEConfig, schedule: VAESchedule, train_cfg: TrainConfig,
              data_cfg: DataConfig, output: str, backend: DistributedBackend,
              log: RunLog | None = None, paths: RunPaths | None = None) -> Path:
    """Train a discrete VAE; returns the checkpoint path."""
    for cfg in (vae_cfg, schedule, train_cfg):
        cfg.validate()
    paths = paths or RunPaths.for_output(output)
    ensure_writable_file(paths.checkpoint, "--vae_output_file_name")
    log = log or RunLog(paths.metrics, backend.is_root)
    seed_everything(train_cfg.seed)
    dataset = build_dataset(data_cfg, vae_cfg.image_size, require_captions=False,
                            flag="--image_folder")
    log.info(describe_dataset(dataset))
    loader = make_loader(dataset, train_cfg, data_cfg, CaptionCollate(None, 0, False))

    task = VAETask(vae_cfg, schedule, train_cfg, data_cfg.to_dict(), backend.device)
    engine = backend.distribute(task.model, task.optimizer, task.scheduler)
    log.info(f"training a VAE: {vae_cfg.image_size}px -> {vae_cfg.fmap_size}x"
             f"{vae_cfg.fmap_size} tokens of {vae_cfg.num_tokens}, {train_cfg.epochs} epochs "
             f"of {len(loader)} steps at batch {train_cfg.batch_size}")
    train(task, engine, backend, loader, len(loader), train_cfg, paths, log)
    log.info(f"saved VAE to {paths.checkpoint}")
    return paths.checkpoint


def ensure_builtin_vae(data_cfg: DataConfig, backend: DistributedBackend, log: RunLog,
                       cache_dir: Path | None = None) -> Path:
    """The cached VAE for the built-in shapes, trained first when there is none."""
    spec = builtin_vae(data_cfg, cache_dir)
    if spec.path.exists():
        log.info(f"no --vae_path given: using the cached built-in VAE {spec.path}")
        return spec.path
    log.info(f"no --vae_path given: training a VAE on built-in shapes first "
             f"(cached as {spec.path} for later runs)")
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    partial = RunPaths(spec.partial_path)
    train_vae(spec.vae, spec.schedule, spec.train, spec.data, str(partial.checkpoint), backend,
              log=RunLog(partial.metrics, backend.is_root), paths=partial)
    if backend.is_root:
        os.replace(partial.checkpoint, spec.path)
        log.info(f"built-in VAE cached as {spec.path}")
    backend.barrier()
    return spec.path


def train_dalle(model_args: dict[str, Any], train_cfg: TrainConfig, data_cfg: DataConfig,
                output: str, backend: DistributedBackend, *, vae_path: str | None = None,
                dalle_path: str | None = None, bpe_path: str | None = None,
                text_seq_len: int = 48, lr_decay: bool = False, fidelity_images: int = 64,
                cache_dir: Path | None = None) -> float | None:
    """Train DALL-E; returns the caption fidelity on built-in data (None elsewhere)."""
    train_cfg.validate()
    if vae_path and dalle_path:
        raise ConfigError("--vae_path and --dalle_path cannot be combined",
                          "a DALL-E checkpoint carries its VAE; give only --dalle_path")
    if fidelity_images < 0:
        raise ConfigError("--fidelity_images must be >= 0 (0 skips the evaluation)")
    for name in model_args.get("attn_types", ()):
        build_pattern(name)
    paths = RunPaths.for_output(output)
    ensure_writable_file(paths.checkpoint, "--dalle_output_file_name")
    log = RunLog(paths.metrics, backend.is_root)
    seed_everything(train_cfg.seed)

    resume: dict[str, Any] | None = None
    if dalle_path:
        resume = load_checkpoint(dalle_path, "--dalle_path", "dalle")
        model_cfg, vae, tokenizer = dalle_parts(resume)
        log.info(f"resuming {dalle_path} at step {resume['step']} (epoch {resume['epoch']})")
    else:
        if vae_path is None:
            if not data_cfg.builtin:
                raise ConfigError("--vae_path is required with --image_text_folder",
                                  "train one first with dalle-dist train-vae --image_folder ...")
            vae_path = str(ensure_builtin_vae(data_cfg, backend, log, cache_dir))
        vae = vae_from_checkpoint(load_checkpoint(vae_path, "--vae_path", "vae"))
        tokenizer = load_tokenizer(bpe_path)
        model_cfg = DALLEConfig(num_text_tokens=tokenizer.vocab_size, text_seq_len=text_seq_len,
                                num_image_tokens=vae.config.num_tokens,
                                image_fmap_size=vae.config.fmap_size, **model_args)
    model_cfg.validate()

    data_cfg = replace(data_cfg, image_size=vae.config.image_size)
    dataset = build_dataset(data_cfg, data_cfg.image_size, require_captions=True)
    check_captions(dataset, tokenizer, model_cfg.text_seq_len, data_cfg.truncate_captions)
    log.info(describe_dataset(dataset))
    collate = CaptionCollate(tokenizer, model_cfg.text_seq_len, data_cfg.truncate_captions)
    loader = make_loader(dataset, train_cfg, data_cfg, collate)

    task = DALLETask(model_cfg, vae, tokenizer, train_cfg, data_cfg.to_dict(), lr_decay,
                     backend.device)
    engine = backend.distribute(task.model, task.optimizer, task.scheduler)
    state = LoopState()
    if resume is not None:
        engine.load_state_dict(resume)
        state = LoopState(epoch=resume["epoch"], step=resume["step"])
        restore_rng(resume["rng"])
    n_params = sum(p.numel() for p in task.model.parameters())
    log.info(f"training DALL-E: {n_params / 1e6:.2f}M parameters, "
             f"{model_cfg.text_seq_len} text + {model_cfg.image_seq_len} image tokens, "
             f"{train_cfg.epochs} epochs of {len(loader)} steps at batch {train_cfg.batch_size}")
    train(task, engine, backend, loader, len(loader), train_cfg, paths, log, state)
    log.info(f"saved DALL-E to {paths.checkpoint}")

    if not (data_cfg.builtin and fidelity_images and backend.is_root):
        return None
    result = evaluate_fidelity(task.model, vae, tokenizer, fidelity_images,
                               data_cfg.shapes_seed, backend.device)
    save_png(make_grid(result.images), paths.samples / "fidelity.png")
    log.info(f"fidelity grid: {paths.samples / 'fidelity.png'}")
    log.info(result.line)
    return result.score
