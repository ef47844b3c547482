"""Flags of `train-vae` and `train`, named as in DALLE-pytorch's train_vae.py / train_dalle.py.

Defaults are sized for the built-in shapes on a CPU (`make demo`); DALLE-pytorch's own
defaults (dim 512, 8192 VAE tokens, 128px ...) target real data on GPUs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dalle_dist.backends import (
    DistributedBackend,
    DistributedConfig,
    add_backend_arguments,
    backend_from_config,
)
from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.cli.exits import report_and_exit
from dalle_dist.cli.parser import add_launcher_rank
from dalle_dist.config_base import add_flags, flag_values, from_args
from dalle_dist.data import DataConfig
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.errors import PeerLost
from dalle_dist.model.config import ComputeConfig, DALLEConfig, VAEConfig
from dalle_dist.train.config import (
    VAE_TRAIN_DEFAULTS,
    DalleRun,
    EMAConfig,
    OptimizerConfig,
    ProfileConfig,
    QualityConfig,
    ResumeConfig,
    TrackerConfig,
    TrainConfig,
    VAERun,
    VAESamples,
    VAESchedule,
    ValidationConfig,
)
from dalle_dist.train.encode import EncodeConfig, EncodeJob
from dalle_dist.train.job import TrainJob, TrainVAEJob


def _add_data_args(parser: argparse.ArgumentParser, folder_flags: list[str], help_text: str,
                   ) -> None:
    group = parser.add_argument_group("data")
    add_flags(group, DataConfig, only=["image_text_folder", "wds", "resize_ratio",
                                       "shapes_count", "shapes_seed", "num_workers"],
              help={"image_text_folder": help_text},
              flag_names={"image_text_folder": folder_flags})


def _add_train_args(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    group = parser.add_argument_group("training")
    add_flags(group, defaults, exclude=["clip_grad_norm"])
    add_flags(group, ResumeConfig)
    add_flags(group, DistributedConfig, only=["device"])
    add_flags(group, ComputeConfig, only=["no_tf32"])
    add_flags(parser, TrackerConfig)
    add_backend_arguments(parser)
    add_launcher_rank(parser)


def _resume_config(args: argparse.Namespace, model: dict[str, object]) -> ResumeConfig:
    """--resume, with the model flags the user typed: a resumed checkpoint must agree with
    them, and takes the rest from its own configs."""
    given = {key: value for key, value in model.items() if key in args.given}
    return from_args(ResumeConfig, args, given_model=given)


def _distributed(args: argparse.Namespace) -> DistributedConfig:
    return from_args(DistributedConfig, args,
                     clip_grad_norm=getattr(args, "clip_grad_norm", None))


def run_on_backend(args: argparse.Namespace, settings: DistributedConfig,
                   command: Callable[[DistributedBackend], object]) -> int:
    """Choose and join the backend, run the command on it, leave the process group.

    Every wait for the other ranks is bounded by --collective_timeout (backends/watch.py);
    after a peer is lost the group is not left politely: leaving could wait for it too.
    """
    backend = backend_from_config(settings)
    backend.initialize()
    # Tells main() to end this rank with os._exit (see cli.exits), error or not.
    args.joined_process_group = backend.world_size > 1
    backend.start_watch(report_and_exit)
    try:
        command(backend)
    except PeerLost:
        raise
    except BaseException:
        backend.shutdown()
        raise
    backend.shutdown()
    return 0


# -- train-vae -----------------------------------------------------------------------

def add_train_vae(p: argparse.ArgumentParser) -> None:
    p.description = ("Train a discrete VAE (DALLE-pytorch's train_vae.py flags).")
    _add_data_args(p, ["--image_folder", "--image_text_folder"],
                   "folder of images, searched recursively")
    add_flags(p.add_argument_group("VAE"), VAEConfig)
    add_flags(p.add_argument_group("temperature and learning-rate schedule"), VAESchedule)
    _add_train_args(p, VAE_TRAIN_DEFAULTS)
    add_flags(p.add_argument_group("samples"), VAESamples)
    add_flags(p.add_argument_group("validation"), ValidationConfig)
    add_flags(p, VAERun)
    p.set_defaults(run=run_train_vae)


def train_vae_job(args: argparse.Namespace) -> TrainVAEJob:
    """The parsed flags of `train-vae` as one job."""
    vae_cfg = from_args(VAEConfig, args)
    return TrainVAEJob(
        vae=vae_cfg, schedule=from_args(VAESchedule, args), run=from_args(VAERun, args),
        train=from_args(TrainConfig, args, clip_grad_norm=None),
        data=from_args(DataConfig, args, image_size=vae_cfg.image_size),
        compute=from_args(ComputeConfig, args),
        resume=_resume_config(args, flag_values(VAEConfig, args)),
        trackers=from_args(TrackerConfig, args), samples=from_args(VAESamples, args),
        validation=from_args(ValidationConfig, args), distributed=_distributed(args))


def run_train_vae(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import train_vae

    job = train_vae_job(args)
    job.validate()  # before any process group or file: one line, exit 2
    return run_on_backend(args, job.distributed, lambda backend: train_vae(job, backend))


# -- train ---------------------------------------------------------------------------

def add_train(p: argparse.ArgumentParser) -> None:
    p.description = ("Train DALL-E (DALLE-pytorch's train_dalle.py flags). "
                     "On the built-in shapes, without --vae_path, a VAE is "
                     "trained first (or taken from the cache).")
    _add_data_args(p, ["--image_text_folder"], "folder of name.png + name.txt pairs")
    add_flags(p, DataConfig, only=["token_shards"])
    add_flags(p, DalleRun, only=["vae_path", "dalle_path"])
    add_flags(p.add_argument_group("VQGAN image tokenizer (taming-transformers), instead of "
                                   "a VAE"), TamingConfig)
    add_flags(p, TokenizerConfig)
    add_flags(p, DataConfig, only=["truncate_captions"])
    add_flags(p.add_argument_group("validation"), ValidationConfig)
    add_flags(p, DalleRun, only=["dalle_output_file_name", "fidelity_images"])
    model = p.add_argument_group("model")
    add_flags(model, DALLEConfig)
    # --no_tf32: with the training flags
    add_flags(model, ComputeConfig, only=["attn_impl", "activation_checkpointing", "compile",
                                          "compile_backend"])
    _add_train_args(p, TrainConfig())
    add_flags(p, TrainConfig, only=["clip_grad_norm"])
    add_flags(p, ProfileConfig)
    add_flags(p, DalleRun, only=["lr_decay"])
    add_flags(p, OptimizerConfig)
    add_flags(p, EMAConfig)
    add_flags(p, QualityConfig)
    add_flags(p, VAEConfig, only=["image_size"],
              help={"image_size": "built-in shapes size when a VAE is trained first"})
    add_flags(p, DalleRun, only=["builtin_vae_epochs"])
    p.set_defaults(run=run_train)


def train_job(args: argparse.Namespace) -> TrainJob:
    """The parsed flags of `train` as one job."""
    model = flag_values(DALLEConfig, args)
    return TrainJob(
        model=model, run=from_args(DalleRun, args), train=from_args(TrainConfig, args),
        data=from_args(DataConfig, args, image_size=args.image_size),
        tokenizer=from_args(TokenizerConfig, args), compute=from_args(ComputeConfig, args),
        resume=_resume_config(args, model), trackers=from_args(TrackerConfig, args),
        validation=from_args(ValidationConfig, args), profile=from_args(ProfileConfig, args),
        taming=from_args(TamingConfig, args), distributed=_distributed(args),
        optim=from_args(OptimizerConfig, args), ema=from_args(EMAConfig, args),
        quality=from_args(QualityConfig, args))


def run_train(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import train_dalle

    job = train_job(args)
    job.validate()  # before any process group or file: one line, exit 2
    return run_on_backend(args, job.distributed, lambda backend: train_dalle(job, backend))


# -- encode --------------------------------------------------------------------------

def add_encode(p: argparse.ArgumentParser) -> None:
    p.description = ("Encode a data set's images once with the frozen VAE or VQGAN into "
                     "token shards, which train --token_shards reads with no image decoding "
                     "and no encoder in the loop. Under a launcher each rank encodes its own "
                     "shards; a rerun finishes an interrupted encode.")
    group = p.add_argument_group("data")
    add_flags(group, DataConfig, only=["image_text_folder", "wds", "shapes_count",
                                       "shapes_seed", "resize_ratio"],
              help={"image_text_folder": "folder of name.png + name.txt pairs, or with --wds "
                                         "WebDataset shards (img2dataset's output as it is)",
                    "resize_ratio": "with --crops: the random crops keep at least this "
                                    "fraction of the image's area"})
    add_flags(p, EncodeConfig)
    add_flags(p.add_argument_group("captions (stored as text and as these token ids; "
                                   "training tokenizes the text with its own flags)"),
              TokenizerConfig)
    add_flags(p, DALLEConfig, only=["text_seq_len"])
    add_flags(p, DataConfig, only=["truncate_captions"])
    add_flags(p, DalleRun, only=["vae_path"])
    add_flags(p.add_argument_group("VQGAN image tokenizer (taming-transformers), instead of "
                                   "a VAE"), TamingConfig)
    add_flags(p, VAEConfig, only=["image_size"],
              help={"image_size": "built-in shapes size when a VAE is trained first"})
    add_flags(p, DalleRun, only=["builtin_vae_epochs"])
    add_flags(p, DistributedConfig, only=["device"])
    add_flags(p, ComputeConfig, only=["no_tf32"])
    add_backend_arguments(p)
    add_launcher_rank(p)
    p.set_defaults(run=run_encode)


def encode_job(args: argparse.Namespace) -> EncodeJob:
    """The parsed flags of `encode` as one job."""
    return EncodeJob(encode=from_args(EncodeConfig, args),
                     data=from_args(DataConfig, args, image_size=args.image_size),
                     tokenizer=from_args(TokenizerConfig, args),
                     text_seq_len=args.text_seq_len,
                     run=from_args(DalleRun, args), taming=from_args(TamingConfig, args),
                     distributed=_distributed(args), tf32=not args.no_tf32)


def run_encode(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import encode

    job = encode_job(args)
    job.validate()  # before any process group or file: one line, exit 2
    return run_on_backend(args, job.distributed, lambda backend: encode(job, backend))
