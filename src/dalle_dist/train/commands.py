"""`train-vae` and `train`: typed configs in, a trained checkpoint out.

Each function checks everything that can be checked (configs, batch split, output paths,
data, the VAE and the tokenizer) before the first step, then hands one Task to the loop.
The backend arrives initialized; every rank runs these functions.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dalle_dist.backends import DistributedBackend, Engine, SingleBackend
from dalle_dist.data import (
    CaptionCollate,
    DataConfig,
    EpochLoader,
    WebDatasetLoader,
    check_captions,
    make_batches,
)
from dalle_dist.data.images import make_grid, save_png
from dalle_dist.data.tokenizer import load_tokenizer
from dalle_dist.errors import ConfigError
from dalle_dist.fileio import ensure_writable_file
from dalle_dist.model import DALLEConfig, PatternOptions, VAEConfig, build_pattern
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
from dalle_dist.train.loop import LoopState, inference_model, train
from dalle_dist.train.run_log import RunLog
from dalle_dist.train.task import Task
from dalle_dist.train.vae_task import VAETask


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rank_batches(data_cfg: DataConfig, image_size: int, train_cfg: TrainConfig,
                 backend: DistributedBackend, collate: CaptionCollate, require_captions: bool,
                 log: RunLog, flag: str = "--image_text_folder"
                 ) -> EpochLoader | WebDatasetLoader:
    """This rank's share of the data, in batches of its share of --batch_size."""
    batches, description = make_batches(
        data_cfg, image_size, backend.rank_batch_size(train_cfg.batch_size), backend.rank,
        backend.world_size, train_cfg.seed, collate, require_captions, flag)
    log.info(description)
    return batches


def describe_batch(backend: DistributedBackend, batch_size: int,
                   loader: EpochLoader | WebDatasetLoader) -> str:
    if backend.world_size == 1:
        return f"batch {batch_size}"
    per_rank = loader.batch_size
    return (f"global batch {per_rank * backend.world_size} = {per_rank} per rank x "
            f"{backend.world_size} ranks ({backend.name})")


def distribute(task: Task, backend: DistributedBackend, train_cfg: TrainConfig) -> Engine:
    engine = backend.distribute(task.model, task.make_optimizer, task.make_scheduler,
                                shard_units=task.shard_units(task.model),
                                clip_grad_norm=train_cfg.clip_grad_norm)
    # Same initial weights everywhere (seeded above); from here on each rank's own stream,
    # so dropout masks and crops differ between ranks as they would between samples.
    torch.manual_seed(train_cfg.seed + backend.rank)
    return engine


def check_attn_impl(attn_impl: str, device: torch.device, attn_dropout: float) -> None:
    """--attn_impl flex trains only where FlexAttention has a backward, and without dropout."""
    if attn_impl != "flex":
        return
    if device.type != "cuda":
        raise ConfigError("--attn_impl flex cannot train on CPU: FlexAttention has no backward "
                          "there", "use --attn_impl auto, gather or sdpa")
    if attn_dropout:
        raise ConfigError("--attn_impl flex has no attention dropout",
                          "set --attn_dropout 0 or use --attn_impl sdpa")


def train_vae(vae_cfg: VAEConfig, schedule: VAESchedule, train_cfg: TrainConfig,
              data_cfg: DataConfig, output: str, backend: DistributedBackend,
              log: RunLog | None = None, paths: RunPaths | None = None) -> Path:
    """Train a discrete VAE; returns the checkpoint path."""
    for cfg in (vae_cfg, schedule, train_cfg):
        cfg.validate()
    backend.check_config(train_cfg.batch_size)
    paths = paths or RunPaths.for_output(output)
    ensure_writable_file(paths.checkpoint, "--vae_output_file_name")
    log = log or RunLog(paths.metrics, backend.is_root)
    seed_everything(train_cfg.seed)
    loader = rank_batches(data_cfg, vae_cfg.image_size, train_cfg, backend,
                          CaptionCollate(None, 0, False), False, log, flag="--image_folder")

    task = VAETask(vae_cfg, schedule, train_cfg, data_cfg.to_dict())
    engine = distribute(task, backend, train_cfg)
    log.info(f"training a VAE: {vae_cfg.image_size}px -> {vae_cfg.fmap_size}x"
             f"{vae_cfg.fmap_size} tokens of {vae_cfg.num_tokens}, {train_cfg.epochs} epochs "
             f"of {len(loader)} steps at {describe_batch(backend, train_cfg.batch_size, loader)}")
    train(task, engine, backend, loader, train_cfg, paths, log)
    log.info(f"saved VAE to {paths.checkpoint}")
    return paths.checkpoint


def builtin_vae_payload(data_cfg: DataConfig, backend: DistributedBackend, log: RunLog,
                        cache_dir: Path | None = None) -> dict[str, Any]:
    """The cached VAE for the built-in shapes, trained first when there is none.

    Rank 0 trains it alone, as a single process (so the cached VAE is the same whatever
    backend asked for it), and sends it to the other ranks, which may be on other machines.
    """
    payload = None
    if backend.is_root:
        spec = builtin_vae(data_cfg, cache_dir)
        if spec.path.exists():
            log.info(f"no --vae_path given: using the cached built-in VAE {spec.path}")
        else:
            log.info(f"no --vae_path given: training a VAE on built-in shapes first "
                     f"(cached as {spec.path} for later runs)")
            partial = RunPaths(spec.partial_path)
            train_vae(spec.vae, spec.schedule, spec.train, spec.data, str(partial.checkpoint),
                      SingleBackend.on(backend.device), log=RunLog(partial.metrics), paths=partial)
            os.replace(partial.checkpoint, spec.path)
            log.info(f"built-in VAE cached as {spec.path}")
        payload = load_checkpoint(str(spec.path), "the cached VAE", "vae")
    return backend.broadcast_object(payload)


def train_dalle(model_args: dict[str, Any], train_cfg: TrainConfig, data_cfg: DataConfig,
                output: str, backend: DistributedBackend, *, vae_path: str | None = None,
                dalle_path: str | None = None, bpe_path: str | None = None,
                text_seq_len: int = 48, lr_decay: bool = False, fidelity_images: int = 64,
                attn_impl: str = "auto", cache_dir: Path | None = None) -> float | None:
    """Train DALL-E; returns the caption fidelity on built-in data (None elsewhere)."""
    train_cfg.validate()
    if vae_path and dalle_path:
        raise ConfigError("--vae_path and --dalle_path cannot be combined",
                          "a DALL-E checkpoint carries its VAE; give only --dalle_path")
    if fidelity_images < 0:
        raise ConfigError("--fidelity_images must be >= 0 (0 skips the evaluation)")
    options = PatternOptions(**{k: model_args[k] for k in (
        "conv_kernel_size", "conv_dilation", "sparse_random_blocks", "sparse_seed")
        if k in model_args})
    for name in model_args.get("attn_types", ()):
        build_pattern(name, options)
    check_attn_impl(attn_impl, backend.device, model_args.get("attn_dropout", 0.0))
    backend.check_config(train_cfg.batch_size)
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
        if vae_path:
            vae = vae_from_checkpoint(load_checkpoint(vae_path, "--vae_path", "vae"))
        elif data_cfg.builtin:
            vae = vae_from_checkpoint(builtin_vae_payload(data_cfg, backend, log, cache_dir))
        else:
            raise ConfigError("--vae_path is required with --image_text_folder",
                              "train one first with dalle-dist train-vae --image_folder ...")
        tokenizer = load_tokenizer(bpe_path)
        model_cfg = DALLEConfig(num_text_tokens=tokenizer.vocab_size, text_seq_len=text_seq_len,
                                num_image_tokens=vae.config.num_tokens,
                                image_fmap_size=vae.config.fmap_size, **model_args)
    model_cfg.validate()

    data_cfg = replace(data_cfg, image_size=vae.config.image_size)
    collate = CaptionCollate(tokenizer, model_cfg.text_seq_len, data_cfg.truncate_captions)
    loader = rank_batches(data_cfg, data_cfg.image_size, train_cfg, backend, collate, True, log)
    check_captions(loader, tokenizer, model_cfg.text_seq_len, data_cfg.truncate_captions)

    task = DALLETask(model_cfg, vae, tokenizer, train_cfg, data_cfg.to_dict(), lr_decay,
                     backend.device, attn_impl)
    n_params = sum(p.numel() for p in task.model.parameters())
    state = LoopState()
    if resume is not None:
        task.model.load_state_dict(resume["weights"])
    engine = distribute(task, backend, train_cfg)
    if resume is not None:
        engine.load_optimizer_state(resume)
        state = LoopState(epoch=resume["epoch"], step=resume["step"])
        restore_rng(resume["rng"])
    log.info(f"training DALL-E: {n_params / 1e6:.2f}M parameters, "
             f"{model_cfg.text_seq_len} text + {model_cfg.image_seq_len} image tokens, "
             f"{train_cfg.epochs} epochs of {len(loader)} steps at "
             f"{describe_batch(backend, train_cfg.batch_size, loader)}")
    train(task, engine, backend, loader, train_cfg, paths, log, state)
    log.info(f"saved DALL-E to {paths.checkpoint}")

    if not (data_cfg.builtin and fidelity_images):
        return None
    model = inference_model(task, engine, backend)  # collective for sharded engines
    if model is None:
        return None
    result = evaluate_fidelity(model, vae, tokenizer, fidelity_images, data_cfg.shapes_seed,
                               backend.device)
    save_png(make_grid(result.images), paths.samples / "fidelity.png")
    log.info(f"fidelity grid: {paths.samples / 'fidelity.png'}")
    log.info(result.line)
    return result.score
