"""`train-vae` and `train`: typed configs in, a trained checkpoint out.

Each function checks everything that can be checked (configs, batch split, output paths,
data, the VAE and the tokenizer) before the first step, then hands one Task to the loop.
The backend arrives initialized; every rank runs these functions.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dalle_dist.backends import DistributedBackend, Engine, SingleBackend
from dalle_dist.checkpoint.checkpointer import Checkpointer
from dalle_dist.checkpoint.formats import resolve_format
from dalle_dist.checkpoint.load import dalle_parts, load_checkpoint, vae_from_checkpoint
from dalle_dist.checkpoint.resume import (
    Start,
    check_flags_agree,
    decide_start,
    read_start,
    restore_training,
)
from dalle_dist.checkpoint.rng import capture_rng, restore_rng
from dalle_dist.checkpoint.taming import TamingConfig, check_carried_vqgan, load_vqgan
from dalle_dist.data import (
    CaptionCollate,
    DataConfig,
    EpochLoader,
    WebDatasetLoader,
    check_captions,
    make_loader,
)
from dalle_dist.data.images import make_grid, save_png
from dalle_dist.data.loader import check_num_workers, default_num_workers
from dalle_dist.data.token_shards import manifest_sha256, read_manifest
from dalle_dist.data.tokenizer import Tokenizer, load_tokenizer
from dalle_dist.errors import ConfigError, DataError, OutputError, Stopped
from dalle_dist.model import DALLEConfig, ImageTokenizer, VAEConfig
from dalle_dist.model.attention_paths import flex_dropout_error
from dalle_dist.model.config import ComputeConfig
from dalle_dist.model.image_tokenizer import content_hash
from dalle_dist.model.init import WeightStream, built_on_meta, checkpoint_weights
from dalle_dist.model.kernels import check_flex_toolchain
from dalle_dist.train.builtin_vae import BUILTIN_VAE_TRAIN, builtin_vae
from dalle_dist.train.compile import DEFAULT_BACKEND, check_compile
from dalle_dist.train.config import (
    OptimizerConfig,
    ResumeConfig,
    RunPaths,
    TrackerConfig,
    TrainConfig,
)
from dalle_dist.train.cpu_settings import HEAP_KEPT, keep_heap
from dalle_dist.train.cuda_settings import TF32_ON, set_cudnn_benchmark, set_tf32
from dalle_dist.train.dalle_task import DALLETask
from dalle_dist.train.encode import EncodeJob, encode_images
from dalle_dist.train.evaluate import evaluate_fidelity
from dalle_dist.train.flops import profile_step
from dalle_dist.train.job import TrainJob, TrainVAEJob
from dalle_dist.train.loop import (
    DeviceSums,
    inference_model,
    optimizer_step,
    steps_per_epoch,
    train,
)
from dalle_dist.train.preemption import requeue_after_stop
from dalle_dist.train.quality import QualityEval, eval_set
from dalle_dist.train.run_log import RunLog
from dalle_dist.train.task import Task
from dalle_dist.train.trackers import Tracker, open_trackers
from dalle_dist.train.vae_task import VAETask

Loader = EpochLoader | WebDatasetLoader


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def loader_workers(data_cfg: DataConfig, backend: DistributedBackend) -> int:
    """--num_workers, or its default (data.loader.default_num_workers) for this device and
    this node's CPUs per local rank; the smallest any rank picks, so every rank uses one
    count (a WebDataset epoch's length depends on it) and none oversubscribes its node.
    A collective: every rank calls it."""
    if data_cfg.num_workers is not None:
        return check_num_workers(data_cfg.num_workers)
    own = default_num_workers(backend.device, backend.local_world_size)
    return min(backend.all_gather_object(own, "the data-loader worker count"))


def rank_loader(data_cfg: DataConfig, image_size: int, train_cfg: TrainConfig,
                backend: DistributedBackend, collate: CaptionCollate, require_captions: bool,
                log: RunLog, flag: str = "--image_text_folder", workers: int = 0,
                val_fraction: float = 0.0) -> Loader:
    """This rank's share of the data, in batches of its share of --batch_size, loaded by
    `workers` processes; pinned on CUDA so the step's non_blocking copies overlap.
    val_fraction: the part held out for validation (the loader's `held_out`)."""
    pin = backend.device.type == "cuda"
    loader, description = make_loader(
        data_cfg, image_size, backend.rank_batch_size(train_cfg.batch_size), backend.rank,
        backend.world_size, train_cfg.seed, collate, require_captions, flag,
        num_workers=workers, pin_memory=pin, val_fraction=val_fraction)
    how = f"{workers} loader processes per rank" if workers else "loaded in the main process"
    log.info(f"{description} ({how}{', pinned' if pin else ''})")
    return loader


def check_same_steps(loader: Loader, backend: DistributedBackend,
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


def checked_loader(data_cfg: DataConfig, train_cfg: TrainConfig,
                   backend: DistributedBackend, collate: CaptionCollate, tokenizer: Any,
                   text_seq_len: int, log: RunLog, workers: int = 0,
                   val_fraction: float = 0.0) -> Loader:
    """This rank's batches of image-caption pairs, captions checked against text_seq_len."""
    loader = rank_loader(data_cfg, data_cfg.image_size, train_cfg, backend, collate, True, log,
                         workers=workers, val_fraction=val_fraction)
    check_captions(loader, tokenizer, text_seq_len, data_cfg.truncate_captions)
    return loader


def describe_batch(backend: DistributedBackend, batch_size: int, loader: Loader) -> str:
    """The batch of one optimizer step and how it is split over micro-batches and ranks."""
    micro, ga, world = loader.batch_size, backend.ga_steps, backend.world_size
    if world == 1:
        return f"batch {batch_size}" + (f" = {ga} micro-batches of {micro}" if ga > 1 else "")
    split = f"{micro} per rank x {ga} micro-batches" if ga > 1 else f"{micro} per rank"
    return (f"global batch {micro * ga * world} = {split} x {world} ranks ({backend.name})")


def model_weights(task: Task, payload: dict[str, Any] | None) -> WeightStream | None:
    """What fills the task's model: a checkpoint's weights or the initial ones, as a
    stream when the model was built on the meta device (the backend places them, FSDP
    each rank its own shards); a model built with values loads a checkpoint's here."""
    saved = None if payload is None else payload["weights"]
    if not built_on_meta(task.model):
        if saved is not None:
            task.model.load_state_dict(saved)
        return None
    return task.initial_weights() if saved is None else checkpoint_weights(task.model, saved)


def distribute(task: Task, backend: DistributedBackend, train_cfg: TrainConfig,
               payload: dict[str, Any] | None = None) -> Engine:
    """The task's model, given its values (the checkpoint's in `payload`, else its
    initial ones), placed and wrapped by the backend; the engine."""
    weights = model_weights(task, payload)
    with backend.waiting("the engine set-up"):  # DDP and FSDP broadcast the weights
        engine = backend.distribute(task.model, task.make_optimizer, task.make_scheduler,
                                    shard_units=task.shard_units(task.model),
                                    clip_grad_norm=train_cfg.clip_grad_norm,
                                    weights=weights)
    # Same initial weights everywhere (seeded above); from here on each rank's own stream,
    # so dropout masks and crops differ between ranks as they would between samples.
    torch.manual_seed(train_cfg.seed + backend.rank)
    return engine


def check_same_optimizer(optim: OptimizerConfig, saved: dict[str, Any] | None,
                         source: Any, total_steps: int | None) -> str | None:
    """A resumed run keeps the checkpoint's optimizer and schedule: the optimizer state
    is per parameter group, and the learning rate at every step must be the uninterrupted
    run's. Checkpoints from before these flags (and DALLE-pytorch imports) hold none:
    Adam with a constant rate or plateau, whatever --lr_decay says now. Returns a note
    when a cosine or linear schedule keeps the checkpoint's step count while this run
    (another --epochs) has another."""
    if saved is None:
        return None
    check_flags_agree(optim.to_dict(), OptimizerConfig.from_dict(saved).to_dict(), source,
                      kind="optimizer and learning-rate schedule",
                      fix="a resumed run keeps them, so that every step's rate is the "
                      "uninterrupted run's: give the checkpoint's values, or start a new run "
                      "from its weights")
    steps = saved.get("schedule_steps")
    if optim.lr_schedule in ("cosine", "linear") and steps and steps != total_steps:
        return (f"--lr_schedule {optim.lr_schedule}: the checkpoint's schedule over {steps} "
                f"steps goes on (this run has {total_steps}); past step {steps} the rate "
                "stays at --min_lr")
    return None


def check_attn_impl(attn_impl: str, device: torch.device, attn_dropout: float) -> None:
    """--attn_impl flex trains only where FlexAttention has a backward, and without dropout."""
    if attn_impl != "flex":
        return
    if device.type != "cuda":
        raise ConfigError("--attn_impl flex cannot train on CPU: FlexAttention has no backward "
                          "there", "use --attn_impl auto, gather or sdpa")
    if attn_dropout:
        raise flex_dropout_error()


@dataclass
class RunSetup:
    """The set-up both training commands share, in the order they run it: flags checked,
    resume decided, checkpoint read (`begin`); data checked (`loader`); then the model
    built by the command; then distributed, restored and trained (`train`). Every rank
    takes each step, so an error on one stops all."""

    backend: DistributedBackend
    train_cfg: TrainConfig
    resume: ResumeConfig
    paths: RunPaths
    log: RunLog
    start: Start
    payload: dict[str, Any] | None  # the checkpoint continued from; None: a fresh run
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    val_every_n_steps: int = 0  # --val_every_n_steps, when the loader holds data out
    quality: QualityEval | None = None  # --eval_every_n_steps
    checkpoint_format: str | None = None  # full, sharded or native (checkpoint/formats.py)
    saved_to: Path | None = None  # where train() saved: the file or the format's directory

    @classmethod
    def begin(cls, kind: str, output_flag: str, backend: DistributedBackend,
              train_cfg: TrainConfig, resume: ResumeConfig, paths: RunPaths,
              log: RunLog, tf32: bool = True, trackers: TrackerConfig | None = None
              ) -> RunSetup:
        """What every command does before its model exists, with every rank on one path:
        TF32 and cuDNN's autotuning set for CUDA (train.cuda_settings), the flags checked
        on all ranks, the output and resume decided by the root, the checkpoint to
        continue read by all and held against the model flags given."""
        if set_tf32(backend.device, tf32):
            log.info(TF32_ON)
        set_cudnn_benchmark(backend.device)
        seed_everything(train_cfg.seed)

        def check_flags() -> str:
            backend.check_config(train_cfg.batch_size)
            return resolve_format(resume.checkpoint_format, backend, resume.async_checkpoint)

        checkpoint_format = backend.everywhere("the flag check", check_flags)
        start = backend.on_root("the resume decision",
                                lambda: decide_start(resume, paths, output_flag, log))
        payload = read_start(start, kind, backend, log)
        if payload is not None:
            check_flags_agree(resume.given_model, payload["configs"]["model"],
                              payload["loaded_from"])
        return cls(backend, train_cfg, resume, paths, log, start, payload,
                   trackers or TrackerConfig(), checkpoint_format=checkpoint_format)

    def loader(self, make: Callable[[int], Loader], data_cfg: DataConfig, flag: str
               ) -> Loader:
        """This rank's data from `make(workers)`, with every rank taking as many steps per
        epoch; workers: loader processes per rank, as loader_workers decides."""
        workers = loader_workers(data_cfg, self.backend)
        loader = self.backend.everywhere("the data check", lambda: make(workers))
        check_same_steps(loader, self.backend, flag)
        return loader

    def train(self, task: Task, loader: Loader, headline: str) -> Engine:
        """The checkpoint's weights into the model, the model distributed, `headline` and
        the batch logged, optimizer, RNG and position restored, on CPU the heap kept
        between steps (train.cpu_settings), then the loop; returns the trained engine."""
        backend, train_cfg, log, payload = self.backend, self.train_cfg, self.log, self.payload
        meta = built_on_meta(task.model)
        engine = distribute(task, backend, train_cfg, payload)
        if task.ema is not None:
            engine.start_ema(task.ema)
            log.info(f"EMA weights: decay {task.ema.decay:g}, from step "
                     f"{task.ema.start_step + 1}, every {task.ema.every} step(s); fp32, "
                     + ("sharded like the parameters" if engine.shards_parameters
                        else "one copy per rank") + "; sample grids, the fidelity check, "
                     + ("validation " if engine.ema_swaps else "")
                     + "and generate use them"
                     + ("" if engine.ema_swaps else " (under ZeRO-3 validation measures the "
                        "trained weights)"))
        if meta and engine.shards_parameters:
            log.info("the model was built on the meta device: each rank "
                     f"{'loaded' if payload is not None else 'initialised'} its own shards")
        # optimizer steps (the loop's, the progress bar's, --save_every_n_steps'), each of
        # --ga_steps micro-batches (the loader's batches)
        epoch_steps = steps_per_epoch(len(loader), backend.ga_steps)
        log.info(f"{headline}, {train_cfg.epochs} epochs of {epoch_steps} steps at "
                 f"{describe_batch(backend, train_cfg.batch_size, loader)}")
        state = None if payload is None else restore_training(
            payload, engine, backend, train_cfg.batch_size, train_cfg.seed, log)
        # The model and optimizer hold what they need of it now. The payload's tensors map
        # the checkpoint file (checkpoint/format.py): dropped, the map goes with them, and
        # a file the run later prunes gives its disk space back.
        self.payload = payload = None
        replaces = self.start.replaces  # --overwrite: the earlier run's files go after it
        checkpointer = Checkpointer(
            self.paths.checkpoint, task, engine, backend,
            every_n_steps=train_cfg.save_every_n_steps, keep_n=self.resume.keep_n_checkpoints,
            save_first=not self.start.own, epochs=train_cfg.epochs,
            after_first_save=None if replaces is None else lambda: replaces.discard(log),
            on_save=log.saved, checkpoint_format=self.checkpoint_format,
            asynchronous=self.resume.async_checkpoint)
        self.saved_to = checkpointer.location
        self.start_trackers(task, engine)
        if keep_heap(backend.device):  # start-up's memory went back to the kernel as before
            log.info(HEAP_KEPT)
        failed = True  # a W&B run that ends in an error is marked failed
        try:
            train(task, engine, backend, loader, train_cfg, self.paths, log, state,
                  checkpointer, self.val_every_n_steps, self.quality)
            checkpointer.wait()  # the last background save is on disk before the run ends
            failed = False
        except Stopped:  # a preempted run saved and resumes: it did not fail
            checkpointer.wait()
            failed = False
            # every rank's save is on disk before a requeue ends the job's processes
            backend.barrier("the saves before the stop")
            if backend.is_root:
                requeue_after_stop(log.info)
            raise
        finally:
            log.close(failed)
        return engine

    def profile_flops(self, task: Task, loader: Loader) -> None:
        """--flops_profiler: the checkpoint's weights (when resuming) into the model, the
        model distributed, one step's FLOPs counted and timed (train/flops.py) and printed
        by the root. Optimizer steps are taken in memory only: nothing is saved."""
        backend, log = self.backend, self.log
        engine = distribute(task, backend, self.train_cfg, self.payload)
        micro_batches = list(itertools.islice(loader.epoch(0), engine.ga_steps))
        if len(micro_batches) < engine.ga_steps:
            raise DataError(f"--flops_profiler needs {engine.ga_steps} micro-batches per rank, "
                            f"the data gives {len(micro_batches)}", "lower --ga_steps or "
                            "--batch_size, or add data")

        def take_step(step: int) -> None:
            optimizer_step(task, engine, backend, micro_batches, self.train_cfg, DeviceSums(),
                           step)

        with backend.waiting("the --flops_profiler step"):
            report = profile_step(task.model, engine, backend,
                                  lambda batch: task.inputs(batch, backend.device),
                                  micro_batches, take_step)
        for line in report.lines():
            log.info(line)
        log.info("--flops_profiler: done; nothing was trained or saved")

    def start_trackers(self, task: Task, engine: Engine) -> None:
        """W&B and TensorBoard on the root, fed by the log from here on; the root's
        failure to start one reaches every rank as one error (nothing waits for it)."""
        if not (self.trackers.wandb or self.trackers.tensorboard_dir):
            return
        log, backend = self.log, self.backend
        config = {**{k: v for k, v in task.configs().items() if k != "tokenizer"},
                  "run": {"backend": backend.name, "world_size": backend.world_size,
                          "precision": backend.precision_name, "ga_steps": engine.ga_steps,
                          "output": str(self.paths.checkpoint)}}

        def start() -> None:
            try:
                opened: list[Tracker] = open_trackers(
                    self.trackers, self.paths.checkpoint.stem,
                    self.paths.checkpoint.parent, log.info)
            except Exception as error:
                what = str(error).splitlines()[0] if str(error) else repr(error)
                raise OutputError(f"an experiment tracker did not start: {what}",
                                  "check --wandb_*/--tensorboard_dir, or leave them out"
                                  ) from error
            log.attach(opened, config)

        backend.on_root("the tracker start", start)


def train_vae(job: TrainVAEJob, backend: DistributedBackend, log: RunLog | None = None,
              paths: RunPaths | None = None) -> Path:
    """Train a discrete VAE; returns the checkpoint path. The held-out part (--val_fraction)
    is split and measured as for train_dalle (its loss is the training loss:
    reconstruction + KL). log / paths: where to log and write, when not beside
    --vae_output_file_name (the built-in VAE's partial file)."""
    job.validate()
    vae_cfg, train_cfg, data_cfg, validation = job.vae, job.train, job.data, job.validation
    paths = paths or RunPaths.for_output(job.run.vae_output_file_name)
    log = log or RunLog(paths.metrics, backend.is_root, loss_plot=paths.loss_plot)
    run = RunSetup.begin("vae", "--vae_output_file_name", backend, train_cfg, job.resume, paths,
                         log, not job.compute.no_tf32, job.trackers)
    run.val_every_n_steps = validation.val_every_n_steps
    if run.payload is not None:
        vae_cfg = VAEConfig.from_dict(run.payload["configs"]["model"])
    data_cfg = replace(data_cfg, image_size=vae_cfg.image_size, channels=vae_cfg.channels)
    loader = run.loader(lambda workers: rank_loader(
        data_cfg, vae_cfg.image_size, train_cfg, backend, CaptionCollate(None, 0, False),
        False, log, flag="--image_folder", workers=workers,
        val_fraction=validation.val_fraction), data_cfg, "--image_folder")
    task = VAETask(vae_cfg, job.schedule, train_cfg, data_cfg.to_dict(), job.samples)
    run.train(task, loader, f"training a VAE: {vae_cfg.image_size}px -> {vae_cfg.fmap_size}x"
              f"{vae_cfg.fmap_size} tokens of {vae_cfg.num_tokens}")
    log.info(f"saved VAE to {run.saved_to}")
    return run.saved_to or paths.checkpoint


def builtin_vae_payload(data_cfg: DataConfig, backend: DistributedBackend, log: RunLog,
                        cache_dir: Path | None = None, epochs: int = BUILTIN_VAE_TRAIN.epochs,
                        tf32: bool = True) -> dict[str, Any]:
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
            streams = capture_rng()  # the VAE's training seeds and draws its own
            try:
                job = TrainVAEJob(vae=spec.vae, schedule=spec.schedule, train=spec.train,
                                  data=spec.data, resume=ResumeConfig(source="auto"),
                                  compute=ComputeConfig(no_tf32=not tf32))
                train_vae(job, SingleBackend.on(backend.device), log=RunLog(partial.metrics),
                          paths=partial)
            finally:
                restore_rng(streams)  # so the DALL-E is the same as with a cached VAE
            os.replace(partial.checkpoint, spec.path)
            if partial.metrics.exists():  # the VAE's training record goes with it
                os.replace(partial.metrics, RunPaths(spec.path).metrics)
            log.info(f"built-in VAE cached as {spec.path}")
        return load_checkpoint(str(spec.path), "the cached VAE", "vae")

    return backend.on_root("the built-in VAE broadcast (rank 0 trains or loads it)", on_root)


def image_tokenizer(taming: TamingConfig, vae_path: str | None, data_cfg: DataConfig,
                    backend: DistributedBackend, log: RunLog, cache_dir: Path | None,
                    builtin_vae_epochs: int, tf32: bool) -> ImageTokenizer:
    """The frozen image tokenizer a run names: the VQGAN (--taming ...), the VAE of
    --vae_path, or on built-in data the built-in VAE (trained first, or cached)."""
    if taming.wanted:
        vae = backend.everywhere("the VQGAN load", lambda: load_vqgan(
            taming.vqgan_model_path, taming.vqgan_config_path))
        log.info(f"image tokens from the VQGAN {taming.vqgan_model_path}: "
                 f"{vae.config.image_size}px -> {vae.config.fmap_size}x"
                 f"{vae.config.fmap_size} tokens of {vae.config.num_tokens}")
        return vae
    if vae_path:
        return backend.everywhere("the VAE load", lambda: vae_from_checkpoint(
            load_checkpoint(vae_path, "--vae_path", "vae")))
    if data_cfg.builtin:
        return vae_from_checkpoint(builtin_vae_payload(
            data_cfg, backend, log, cache_dir, builtin_vae_epochs, tf32))
    # DALLE-pytorch falls back on OpenAI's pretrained dVAE here, downloaded at run
    # time; dalle-dist downloads no weights, so it names what works instead.
    raise ConfigError(
        "--vae_path is required with --image_text_folder (DALLE-pytorch would "
        "download OpenAI's pretrained dVAE here; dalle-dist downloads no weights)",
        "train one with dalle-dist train-vae --image_folder ... and give --vae_path, "
        "or use a taming VQGAN: --taming --vqgan_model_path last.ckpt "
        "--vqgan_config_path model.yaml")


def tokenizer_source(data_cfg: DataConfig) -> DataConfig:
    """The data the image tokenizer is chosen by: token shards encoded from the built-in
    shapes by the built-in VAE name it by their image size and shapes seed, so training
    from them finds the same cached VAE without --vae_path."""
    if not data_cfg.token_shards:
        return data_cfg
    manifest = read_manifest(data_cfg.token_shards)
    shapes = manifest["source"].get("builtin_shapes")
    if shapes is None:
        return data_cfg
    return replace(data_cfg, token_shards=None, image_text_folder=None,
                   image_size=manifest["image_tokenizer"]["image_size"],
                   shapes_seed=shapes["seed"])


def check_token_shards(directory: str, vae: ImageTokenizer) -> str:
    """Token shards of another image tokenizer are refused: their ids would index another
    codebook. Returns the manifest's hash, which the checkpoints record."""
    manifest = read_manifest(directory)
    image = manifest["image_tokenizer"]
    have = content_hash(vae)
    if image["sha256"] != have:
        raise ConfigError(
            f"--token_shards {directory} was encoded by the {image['kind']} "
            f"{image['sha256'][:12]}, not by this run's image tokenizer ({have[:12]})",
            "pass the VAE (--vae_path) or VQGAN it was encoded with, or encode again with "
            "this one")
    if image["image_size"] != vae.config.image_size or (
            image["fmap_size"] != vae.config.fmap_size):
        raise ConfigError(
            f"--token_shards {directory}: its manifest says {image['image_size']}px -> "
            f"{image['fmap_size']}x{image['fmap_size']} tokens, the image tokenizer "
            f"{vae.config.image_size}px -> {vae.config.fmap_size}x{vae.config.fmap_size}",
            "encode again: the manifest was edited or written by another version")
    return manifest_sha256(directory)


def encode(job: EncodeJob, backend: DistributedBackend, cache_dir: Path | None = None
           ) -> dict[str, Any]:
    """`dalle-dist encode` (train/encode.py) with the image tokenizer `train` would use."""
    set_tf32(backend.device, job.tf32)
    return encode_images(job, backend, lambda data_cfg, log: image_tokenizer(
        job.taming, job.run.vae_path, data_cfg, backend, log, cache_dir,
        job.run.builtin_vae_epochs, job.tf32))


def start_evaluation(quality: QualityEval, job: TrainJob, loader: Loader, vae: ImageTokenizer,
                     tokenizer: Tokenizer, text_seq_len: int, data_cfg: DataConfig,
                     backend: DistributedBackend, log: RunLog) -> None:
    """--eval_every_n_steps: sampling's parts on every rank; the captions and the real
    images' features on the root, before the model is built (its errors reach every
    rank, train/quality.py)."""
    quality.bind(vae, tokenizer, text_seq_len, loader.batch_size)
    device = backend.device

    @torch.no_grad()
    def decode(tokens: torch.Tensor) -> torch.Tensor:  # token shards: pixels of the real part
        return vae.decode(tokens.long().to(device)).float().cpu()

    def prepare() -> tuple[str, int]:
        data = eval_set(job.quality, getattr(loader, "held_out", None), data_cfg.builtin,
                        data_cfg.image_size, data_cfg.channels, data_cfg.shapes_seed, decode)
        quality.prepare(data, data_cfg.image_size, device)
        real = len(data.real) if data.real is not None else 0
        measured = [name for name, on in (
            (f"FID against {real} real images", quality.fid is not None),
            ("CLIP score", quality.clip is not None),
            ("caption fidelity", data.shapes)) if on]
        return (f"evaluation every {quality.every} steps and at the end: "
                f"{len(data.captions)} images; {', '.join(measured)}", len(data.captions))

    line, quality.images = backend.on_root("the evaluation set", prepare)
    log.info(line)


def train_dalle(job: TrainJob, backend: DistributedBackend, cache_dir: Path | None = None
                ) -> float | None:
    """Train DALL-E; returns the caption fidelity on built-in data (None elsewhere, and
    with --flops_profiler, which counts and times one step, prints the table
    (train/flops.py) and trains and saves nothing). cache_dir: where the built-in VAE is
    cached (default: builtin_vae.default_cache_dir)."""
    job.validate()
    model_args, train_cfg, data_cfg, validation = job.model, job.train, job.data, job.validation
    resume, taming, tokenizer_cfg, trackers = (job.continues, job.taming, job.tokenizer,
                                               job.trackers)
    vae_path, tf32 = job.run.vae_path, not job.compute.no_tf32
    attn_impl = job.compute.attn_impl
    check_attn_impl(attn_impl, backend.device, model_args.get("attn_dropout", 0.0))
    compile_backend = (job.compute.compile_backend or DEFAULT_BACKEND
                       if job.compute.compile else None)
    # Before anything is trained or written: a bad tokenizer file must not wait for the
    # built-in VAE's training.
    requested = backend.everywhere("the tokenizer load", lambda: load_tokenizer(tokenizer_cfg))
    quality = QualityEval(job.quality) if job.quality.measures else None
    if quality is not None:  # the metrics' files, loaded (or refused) on the root
        backend.on_root("the image-quality metrics' files",
                        lambda: quality.load_files(backend.device))
    paths = RunPaths.for_output(job.run.dalle_output_file_name)
    log = RunLog(paths.metrics, backend.is_root, loss_plot=paths.loss_plot)
    run = RunSetup.begin("dalle", "--dalle_output_file_name", backend, train_cfg, resume,
                         paths, log, tf32, trackers)
    run.val_every_n_steps = validation.val_every_n_steps
    if compile_backend is not None:  # after begin: the backend's config is complete there
        backend.everywhere("the --compile check",
                           lambda: check_compile(compile_backend, backend))
    if backend.device.type == "cuda":  # FlexAttention compiles there: before any VAE trains
        attn_types = (run.payload["configs"]["model"]["attn_types"] if run.payload is not None
                      else model_args.get("attn_types", ()))
        backend.everywhere("the FlexAttention check", lambda: check_flex_toolchain(
            attn_types, attn_impl, backend.device))
    if run.payload is not None:
        check_carried_vqgan(run.payload["configs"]["vae"], taming, resume.flag,
                            run.payload["loaded_from"])
        model_cfg, vae, tokenizer = backend.everywhere("the checkpoint's tokenizer", lambda: (
            dalle_parts(run.payload, tokenizer_cfg, str(run.payload["loaded_from"]))))
        if vae_path:
            log.info("the checkpoint carries its VAE: --vae_path is not used")
    else:
        vae = image_tokenizer(taming, vae_path, tokenizer_source(data_cfg), backend, log,
                              cache_dir, job.run.builtin_vae_epochs, tf32)
        tokenizer = requested
        model_cfg = DALLEConfig(num_text_tokens=tokenizer.vocab_size,
                                num_image_tokens=vae.config.num_tokens,
                                image_fmap_size=vae.config.fmap_size, **model_args)
    model_cfg.validate()

    data_cfg = replace(data_cfg, image_size=vae.config.image_size, channels=vae.config.channels)
    data_record = data_cfg.to_dict()
    if data_cfg.token_shards:
        data_record["token_shards_manifest_sha256"] = backend.everywhere(
            "the token shards check", lambda: check_token_shards(data_cfg.token_shards, vae))
    collate = CaptionCollate(tokenizer, model_cfg.text_seq_len, data_cfg.truncate_captions)
    loader = run.loader(lambda workers: checked_loader(
        data_cfg, train_cfg, backend, collate, tokenizer, model_cfg.text_seq_len, log,
        workers, validation.val_fraction), data_cfg, "--image_text_folder")

    if quality is not None:
        start_evaluation(quality, job, loader, vae, tokenizer, model_cfg.text_seq_len,
                         data_cfg, backend, log)
        run.quality = quality

    activation_checkpointing = job.compute.activation_checkpointing
    task = DALLETask(model_cfg, vae, tokenizer, train_cfg, data_record, job.run.lr_decay,
                     backend.device, attn_impl, precision=backend.precision(),
                     activation_checkpointing=activation_checkpointing,
                     compile_backend=compile_backend, optim=job.optim,
                     total_steps=train_cfg.epochs * steps_per_epoch(len(loader),
                                                                    backend.ga_steps),
                     ema=job.ema)
    if run.payload is not None:
        note = check_same_optimizer(task.optim, run.payload["configs"].get("optimizer"),
                                    run.payload["loaded_from"], task.total_steps)
        if note:
            log.info(note)
    n_params = sum(p.numel() for p in task.model.parameters())  # a shared one once
    if activation_checkpointing:
        log.info(f"activation checkpointing: every transformer block ({model_cfg.depth}) "
                 "recomputes its activations in backward")
    if compile_backend is not None:
        log.info(f"--compile: every transformer block ({model_cfg.depth}) compiled with "
                 f"{compile_backend}, whole (fullgraph), in the second step")
    if job.profile.flops_profiler:
        run.profile_flops(task, loader)
        return None
    engine = run.train(task, loader, f"training DALL-E: {n_params / 1e6:.2f}M parameters, "
                       f"{model_cfg.text_seq_len} text + {model_cfg.image_seq_len} image tokens")
    log.info(f"saved DALL-E to {run.saved_to}")

    fidelity_images = job.run.fidelity_images
    if not (data_cfg.builtin and fidelity_images):
        return None
    with engine.ema_applied():  # --ema_decay: the average is what is measured
        with backend.waiting("the weight gather for the fidelity check"):
            model = inference_model(task, engine, backend)  # collective for sharded engines
        if model is None:
            return None
        result = evaluate_fidelity(model, vae, tokenizer, fidelity_images,
                                   data_cfg.shapes_seed, backend.device)
    save_png(make_grid(result.images), paths.samples / "fidelity.png")
    log.info(f"fidelity grid: {paths.samples / 'fidelity.png'}")
    log.info(result.line)
    return result.score
