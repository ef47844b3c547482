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
from dalle_dist.errors import ConfigError, Stopped
from dalle_dist.fileio import ensure_writable_file
from dalle_dist.model import DALLEConfig, PatternOptions, VAEConfig, build_pattern
from dalle_dist.train.builtin_vae import builtin_vae
from dalle_dist.train.checkpoint import (
    dalle_parts,
    load_checkpoint,
    restore_rank_rng,
    vae_from_checkpoint,
)
from dalle_dist.train.config import ResumeConfig, RunPaths, TrainConfig, VAESchedule
from dalle_dist.train.dalle_task import DALLETask
from dalle_dist.train.evaluate import evaluate_fidelity
from dalle_dist.train.loop import LoopState, inference_model, train
from dalle_dist.train.resume import check_flags_agree, is_own_checkpoint, newest_checkpoint
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


def remove_unfinished_saves(paths: RunPaths, log: RunLog) -> None:
    """Temporary files of saves that a kill cut short (the rename never happened)."""
    for leftover in paths.checkpoint.parent.glob(f".{paths.checkpoint.name}.*.tmp"):
        log.info(f"removing an unfinished save: {leftover}")
        leftover.unlink(missing_ok=True)


def find_resume(resume: ResumeConfig, paths: RunPaths, kind: str,
                backend: DistributedBackend, log: RunLog) -> tuple[dict[str, Any] | None, bool]:
    """The checkpoint to continue from (None: a fresh run) and whether it is this run's
    own newest one (then there is no need to save it again before the first step)."""
    source, flag = resume.source, resume.flag
    if source and backend.is_root:
        remove_unfinished_saves(paths, log)
    if source == "auto":
        found = newest_checkpoint(paths, log)
        if found is None:
            log.info(f"--resume auto: no checkpoint of {paths.checkpoint} yet: starting fresh")
            return None, False
        source, flag = str(found), "--resume"
    if source is None:
        return None, False
    payload = load_checkpoint(source, flag, kind, keep_ds_dir=backend.name == "deepspeed")
    within = f", {payload['batch']} batches into the next" if payload.get("batch") else ""
    log.info(f"resuming {source} at step {payload['step']} (epoch {payload['epoch']}{within})")
    payload["loaded_from"] = str(source)
    return payload, is_own_checkpoint(Path(source), paths)


def restore_training(payload: dict[str, Any], engine: Engine, backend: DistributedBackend,
                     train_cfg: TrainConfig, log: RunLog) -> LoopState:
    """Optimizer, scheduler, RNG and data position of `payload`, put back on this rank.

    Called last before the loop, so no setup step draws from the restored RNG.
    """
    why = engine.load_training_state(payload)
    if why:
        log.info(f"warning: the optimizer starts fresh ({why})")
    state = LoopState.from_checkpoint(payload)
    saved_batch = payload["configs"].get("train", {}).get("batch_size", train_cfg.batch_size)
    if state.batch and saved_batch != train_cfg.batch_size:
        state.batch = state.batch * saved_batch // train_cfg.batch_size
        log.info(f"warning: --batch_size {train_cfg.batch_size} differs from the "
                 f"checkpoint's {saved_batch}: the epoch goes on from batch {state.batch}")
    exact = restore_rank_rng(payload["rng"], backend.rank, backend.world_size,
                             train_cfg.seed + state.step)
    if not exact:
        log.info(f"warning: the checkpoint was saved by {payload['world_size']} rank(s), this "
                 f"run has {backend.world_size}: random states reseeded (the run continues, "
                 "but no longer repeats an uninterrupted one exactly)")
    return state


def stop_everywhere(stopped: Stopped | None, backend: DistributedBackend) -> None:
    """Rank 0 trained alone (the built-in VAE) and may have been stopped: all ranks stop."""
    message = backend.broadcast_object(str(stopped) if stopped else None)
    if message:
        raise Stopped(message if backend.is_root else "")


def train_vae(vae_cfg: VAEConfig, schedule: VAESchedule, train_cfg: TrainConfig,
              data_cfg: DataConfig, output: str, backend: DistributedBackend,
              log: RunLog | None = None, paths: RunPaths | None = None,
              resume: ResumeConfig | None = None) -> Path:
    """Train a discrete VAE; returns the checkpoint path."""
    resume = resume or ResumeConfig()
    for cfg in (vae_cfg, schedule, train_cfg, resume):
        cfg.validate()
    backend.check_config(train_cfg.batch_size)
    paths = paths or RunPaths.for_output(output)
    ensure_writable_file(paths.checkpoint, "--vae_output_file_name")
    log = log or RunLog(paths.metrics, backend.is_root)
    seed_everything(train_cfg.seed)
    payload, own = find_resume(resume, paths, "vae", backend, log)
    if payload is not None:
        check_flags_agree(resume.given_model, payload["configs"]["model"],
                          payload["loaded_from"])
        vae_cfg = VAEConfig.from_dict(payload["configs"]["model"])
    loader = rank_batches(data_cfg, vae_cfg.image_size, train_cfg, backend,
                          CaptionCollate(None, 0, False), False, log, flag="--image_folder")

    task = VAETask(vae_cfg, schedule, train_cfg, data_cfg.to_dict())
    if payload is not None and payload["weights"] is not None:
        task.model.load_state_dict(payload["weights"])
    engine = distribute(task, backend, train_cfg)
    log.info(f"training a VAE: {vae_cfg.image_size}px -> {vae_cfg.fmap_size}x"
             f"{vae_cfg.fmap_size} tokens of {vae_cfg.num_tokens}, {train_cfg.epochs} epochs "
             f"of {len(loader)} steps at {describe_batch(backend, train_cfg.batch_size, loader)}")
    state = None if payload is None else restore_training(payload, engine, backend, train_cfg,
                                                          log)
    train(task, engine, backend, loader, train_cfg, paths, log, state, save_first=not own,
          keep_n=resume.keep_n_checkpoints)
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
            try:
                train_vae(spec.vae, spec.schedule, spec.train, spec.data,
                          str(partial.checkpoint), SingleBackend.on(backend.device),
                          log=RunLog(partial.metrics), paths=partial)
            except Stopped as exc:
                stop_everywhere(exc, backend)  # the partial VAE is not cached
            os.replace(partial.checkpoint, spec.path)
            log.info(f"built-in VAE cached as {spec.path}")
        stop_everywhere(None, backend)
        payload = load_checkpoint(str(spec.path), "the cached VAE", "vae")
    else:
        stop_everywhere(None, backend)
    return backend.broadcast_object(payload)


def train_dalle(model_args: dict[str, Any], train_cfg: TrainConfig, data_cfg: DataConfig,
                output: str, backend: DistributedBackend, *, vae_path: str | None = None,
                resume: ResumeConfig | None = None, bpe_path: str | None = None,
                text_seq_len: int = 48, lr_decay: bool = False, fidelity_images: int = 64,
                attn_impl: str = "auto", cache_dir: Path | None = None) -> float | None:
    """Train DALL-E; returns the caption fidelity on built-in data (None elsewhere)."""
    resume = resume or ResumeConfig()
    train_cfg.validate()
    resume.validate()
    if vae_path and resume.source and resume.source != "auto":
        raise ConfigError(f"--vae_path and {resume.flag} cannot be combined",
                          "a DALL-E checkpoint carries its VAE; drop --vae_path")
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

    payload, own = find_resume(resume, paths, "dalle", backend, log)
    if payload is not None:
        check_flags_agree(resume.given_model, payload["configs"]["model"],
                          payload["loaded_from"])
        model_cfg, vae, tokenizer = dalle_parts(payload)
        if vae_path:
            log.info("the checkpoint carries its VAE: --vae_path is not used")
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
    if payload is not None and payload["weights"] is not None:
        task.model.load_state_dict(payload["weights"])
    engine = distribute(task, backend, train_cfg)
    log.info(f"training DALL-E: {n_params / 1e6:.2f}M parameters, "
             f"{model_cfg.text_seq_len} text + {model_cfg.image_seq_len} image tokens, "
             f"{train_cfg.epochs} epochs of {len(loader)} steps at "
             f"{describe_batch(backend, train_cfg.batch_size, loader)}")
    state = None if payload is None else restore_training(payload, engine, backend, train_cfg,
                                                          log)
    train(task, engine, backend, loader, train_cfg, paths, log, state, save_first=not own,
          keep_n=resume.keep_n_checkpoints)
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
