"""`train-vae` and `train`: typed configs in, a trained checkpoint out.

Each function checks everything that can be checked (configs, batch split, output paths,
data, the VAE and the tokenizer) before the first step, then hands one Task to the loop.
The backend arrives initialized; every rank runs these functions.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
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
from dalle_dist.errors import ConfigError, DataError
from dalle_dist.model import DALLEConfig, PatternOptions, VAEConfig, build_pattern
from dalle_dist.train.builtin_vae import BUILTIN_VAE_TRAIN, builtin_vae
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
from dalle_dist.train.resume import Start, check_flags_agree, decide_start
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


def check_same_steps(loader: EpochLoader | WebDatasetLoader, backend: DistributedBackend,
                     flag: str) -> None:
    """Every rank must take as many steps per epoch as the others, or the one that runs
    out first leaves the rest waiting in an all-reduce; ranks that list the data on their
    own node's disk can see different files."""
    steps = backend.all_gather_object(len(loader), "the steps-per-epoch check")
    if len(set(steps)) > 1:
        seen = ", ".join(f"rank {rank} {n}" for rank, n in enumerate(steps))
        raise DataError(f"the ranks see different data: steps per epoch {seen}",
                        f"every rank must read the same {flag}: put it on a file system "
                        "all nodes share, or copy it identically to each")


def checked_batches(data_cfg: DataConfig, train_cfg: TrainConfig,
                    backend: DistributedBackend, collate: CaptionCollate, tokenizer: Any,
                    text_seq_len: int, log: RunLog) -> EpochLoader | WebDatasetLoader:
    """This rank's batches of image-caption pairs, captions checked against text_seq_len."""
    loader = rank_batches(data_cfg, data_cfg.image_size, train_cfg, backend, collate, True, log)
    check_captions(loader, tokenizer, text_seq_len, data_cfg.truncate_captions)
    return loader


def describe_batch(backend: DistributedBackend, batch_size: int,
                   loader: EpochLoader | WebDatasetLoader) -> str:
    if backend.world_size == 1:
        return f"batch {batch_size}"
    per_rank = loader.batch_size
    return (f"global batch {per_rank * backend.world_size} = {per_rank} per rank x "
            f"{backend.world_size} ranks ({backend.name})")


def distribute(task: Task, backend: DistributedBackend, train_cfg: TrainConfig) -> Engine:
    with backend.waiting("the engine set-up"):  # DDP and FSDP broadcast the weights
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


def load_start(start: Start, kind: str, backend: DistributedBackend,
               log: RunLog) -> dict[str, Any] | None:
    """The checkpoint the run continues from, read by every rank (None: a fresh run)."""
    if start.source is None:
        return None
    payload = backend.everywhere("the checkpoint load", lambda: load_checkpoint(
        start.source, start.flag, kind, keep_ds_dir=backend.name == "deepspeed"))
    within = f", {payload['batch']} batches into the next" if payload.get("batch") else ""
    log.info(f"resuming {start.source} at step {payload['step']} (epoch {payload['epoch']}"
             f"{within})")
    payload["loaded_from"] = start.source
    return payload


def begin(resume: ResumeConfig, paths: RunPaths, output_flag: str, kind: str,
          backend: DistributedBackend, batch_size: int, log: RunLog
          ) -> tuple[Start, dict[str, Any] | None]:
    """What every command does before its model exists, with every rank on one path: the
    flags checked on all ranks, the output and resume decided by the root, the
    checkpoint to continue read by all. An error on any rank stops every rank."""
    backend.everywhere("the flag check", lambda: backend.check_config(batch_size))
    start = backend.on_root("the resume decision",
                            lambda: decide_start(resume, paths, output_flag, log))
    return start, load_start(start, kind, backend, log)


def after_first_save(start: Start, log: RunLog) -> Callable[[], None] | None:
    """--overwrite: the earlier run's files go once the new run has saved once."""
    replaces = start.replaces
    return None if replaces is None else lambda: replaces.discard(log)


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


def train_vae(vae_cfg: VAEConfig, schedule: VAESchedule, train_cfg: TrainConfig,
              data_cfg: DataConfig, output: str, backend: DistributedBackend,
              log: RunLog | None = None, paths: RunPaths | None = None,
              resume: ResumeConfig | None = None) -> Path:
    """Train a discrete VAE; returns the checkpoint path."""
    resume = resume or ResumeConfig()
    for cfg in (vae_cfg, schedule, train_cfg, resume):
        cfg.validate()
    paths = paths or RunPaths.for_output(output)
    log = log or RunLog(paths.metrics, backend.is_root)
    seed_everything(train_cfg.seed)
    start, payload = begin(resume, paths, "--vae_output_file_name", "vae", backend,
                           train_cfg.batch_size, log)
    if payload is not None:
        check_flags_agree(resume.given_model, payload["configs"]["model"],
                          payload["loaded_from"])
        vae_cfg = VAEConfig.from_dict(payload["configs"]["model"])
    loader = backend.everywhere("the data check", lambda: rank_batches(
        data_cfg, vae_cfg.image_size, train_cfg, backend, CaptionCollate(None, 0, False),
        False, log, flag="--image_folder"))
    check_same_steps(loader, backend, "--image_folder")

    task = VAETask(vae_cfg, schedule, train_cfg, data_cfg.to_dict())
    if payload is not None and payload["weights"] is not None:
        task.model.load_state_dict(payload["weights"])
    engine = distribute(task, backend, train_cfg)
    log.info(f"training a VAE: {vae_cfg.image_size}px -> {vae_cfg.fmap_size}x"
             f"{vae_cfg.fmap_size} tokens of {vae_cfg.num_tokens}, {train_cfg.epochs} epochs "
             f"of {len(loader)} steps at {describe_batch(backend, train_cfg.batch_size, loader)}")
    state = None if payload is None else restore_training(payload, engine, backend, train_cfg,
                                                          log)
    train(task, engine, backend, loader, train_cfg, paths, log, state, save_first=not start.own,
          keep_n=resume.keep_n_checkpoints, after_first_save=after_first_save(start, log))
    log.info(f"saved VAE to {paths.checkpoint}")
    return paths.checkpoint


def builtin_vae_payload(data_cfg: DataConfig, backend: DistributedBackend, log: RunLog,
                        cache_dir: Path | None = None, epochs: int = BUILTIN_VAE_TRAIN.epochs
                        ) -> dict[str, Any]:
    """The cached VAE for the built-in shapes, trained first when there is none.

    Rank 0 trains it alone, as a single process (so the cached VAE is the same whatever
    backend asked for it), and sends it to the other ranks, which may be on other
    machines: one broadcast carries the VAE, or why there is none (an error, a stop), so
    every rank leaves by the same path. A training cut short continues where its partial
    file ends (resuming is exact), and only a finished one is cached.
    """
    def on_root() -> dict[str, Any]:
        spec = builtin_vae(data_cfg, cache_dir, epochs)
        if spec.path.exists():
            log.info(f"no --vae_path given: using the cached built-in VAE {spec.path}")
        else:
            log.info(f"no --vae_path given: training a VAE on built-in shapes first "
                     f"(cached as {spec.path} for later runs)")
            partial = RunPaths(spec.partial_path)
            train_vae(spec.vae, spec.schedule, spec.train, spec.data,
                      str(partial.checkpoint), SingleBackend.on(backend.device),
                      log=RunLog(partial.metrics), paths=partial,
                      resume=ResumeConfig(source="auto"))
            os.replace(partial.checkpoint, spec.path)
            log.info(f"built-in VAE cached as {spec.path}")
        return load_checkpoint(str(spec.path), "the cached VAE", "vae")

    return backend.on_root("the built-in VAE broadcast (rank 0 trains or loads it)", on_root)


def train_dalle(model_args: dict[str, Any], train_cfg: TrainConfig, data_cfg: DataConfig,
                output: str, backend: DistributedBackend, *, vae_path: str | None = None,
                resume: ResumeConfig | None = None, bpe_path: str | None = None,
                text_seq_len: int = 48, lr_decay: bool = False, fidelity_images: int = 64,
                attn_impl: str = "auto", cache_dir: Path | None = None,
                builtin_vae_epochs: int = BUILTIN_VAE_TRAIN.epochs) -> float | None:
    """Train DALL-E; returns the caption fidelity on built-in data (None elsewhere)."""
    resume = resume or ResumeConfig()
    train_cfg.validate()
    resume.validate()
    if vae_path and resume.source and resume.source != "auto":
        raise ConfigError(f"--vae_path and {resume.flag} cannot be combined",
                          "a DALL-E checkpoint carries its VAE; drop --vae_path")
    if fidelity_images < 0:
        raise ConfigError("--fidelity_images must be >= 0 (0 skips the evaluation)")
    if builtin_vae_epochs < 1:
        raise ConfigError(f"--builtin_vae_epochs must be >= 1, got {builtin_vae_epochs}")
    options = PatternOptions(**{k: model_args[k] for k in (
        "conv_kernel_size", "conv_dilation", "sparse_random_blocks", "sparse_seed")
        if k in model_args})
    for name in model_args.get("attn_types", ()):
        build_pattern(name, options)
    check_attn_impl(attn_impl, backend.device, model_args.get("attn_dropout", 0.0))
    paths = RunPaths.for_output(output)
    log = RunLog(paths.metrics, backend.is_root)
    seed_everything(train_cfg.seed)

    start, payload = begin(resume, paths, "--dalle_output_file_name", "dalle", backend,
                           train_cfg.batch_size, log)
    if payload is not None:
        check_flags_agree(resume.given_model, payload["configs"]["model"],
                          payload["loaded_from"])
        model_cfg, vae, tokenizer = dalle_parts(payload)
        if vae_path:
            log.info("the checkpoint carries its VAE: --vae_path is not used")
    else:
        if vae_path:
            vae = backend.everywhere("the VAE load", lambda: vae_from_checkpoint(
                load_checkpoint(vae_path, "--vae_path", "vae")))
        elif data_cfg.builtin:
            vae = vae_from_checkpoint(builtin_vae_payload(data_cfg, backend, log, cache_dir,
                                                          builtin_vae_epochs))
        else:
            raise ConfigError("--vae_path is required with --image_text_folder",
                              "train one first with dalle-dist train-vae --image_folder ...")
        tokenizer = backend.everywhere("the tokenizer load", lambda: load_tokenizer(bpe_path))
        model_cfg = DALLEConfig(num_text_tokens=tokenizer.vocab_size, text_seq_len=text_seq_len,
                                num_image_tokens=vae.config.num_tokens,
                                image_fmap_size=vae.config.fmap_size, **model_args)
    model_cfg.validate()

    data_cfg = replace(data_cfg, image_size=vae.config.image_size)
    collate = CaptionCollate(tokenizer, model_cfg.text_seq_len, data_cfg.truncate_captions)
    loader = backend.everywhere("the data check", lambda: checked_batches(
        data_cfg, train_cfg, backend, collate, tokenizer, model_cfg.text_seq_len, log))
    check_same_steps(loader, backend, "--image_text_folder")

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
    train(task, engine, backend, loader, train_cfg, paths, log, state, save_first=not start.own,
          keep_n=resume.keep_n_checkpoints, after_first_save=after_first_save(start, log))
    log.info(f"saved DALL-E to {paths.checkpoint}")

    if not (data_cfg.builtin and fidelity_images):
        return None
    with backend.waiting("the weight gather for the fidelity check"):
        model = inference_model(task, engine, backend)  # collective for sharded engines
    if model is None:
        return None
    result = evaluate_fidelity(model, vae, tokenizer, fidelity_images, data_cfg.shapes_seed,
                               backend.device)
    save_png(make_grid(result.images), paths.samples / "fidelity.png")
    log.info(f"fidelity grid: {paths.samples / 'fidelity.png'}")
    log.info(result.line)
    return result.score
