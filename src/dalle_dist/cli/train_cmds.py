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
from dalle_dist.config_base import add_flags, flag_values, from_args
from dalle_dist.data import DataConfig
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.errors import ConfigError, PeerLost
from dalle_dist.model.config import ComputeConfig, DALLEConfig, VAEConfig
from dalle_dist.train.builtin_vae import BUILTIN_VAE_TRAIN
from dalle_dist.train.config import (
    VAE_TRAIN_DEFAULTS,
    ProfileConfig,
    ResumeConfig,
    TrackerConfig,
    TrainConfig,
    VAESamples,
    VAESchedule,
    ValidationConfig,
)


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


def _resume_config(args: argparse.Namespace, model: dict[str, object],
                   path_flag: str | None = None) -> ResumeConfig:
    """--resume (or DALLE-pytorch's --dalle_path) and the model flags the user typed."""
    path = getattr(args, path_flag.lstrip("-"), None) if path_flag else None
    if path and args.source:
        raise ConfigError(f"--resume and {path_flag} both name a checkpoint", "give one of them")
    given = {key: value for key, value in model.items() if key in args.given}
    if args.overwrite and args.source == "auto":
        raise ConfigError("--overwrite and --resume auto contradict each other",
                          "--resume auto continues the output's checkpoint, --overwrite "
                          "replaces it: give one of them")
    return from_args(ResumeConfig, args, source=path or args.source,
                     flag=path_flag if path else "--resume", given_model=given)


def run_on_backend(args: argparse.Namespace, command: Callable[[DistributedBackend], None]
                   ) -> int:
    """Choose and join the backend, run the command on it, leave the process group.

    Every wait for the other ranks is bounded by --collective_timeout (backends/watch.py);
    after a peer is lost the group is not left politely: leaving could wait for it too.
    """
    settings = from_args(DistributedConfig, args,
                         clip_grad_norm=getattr(args, "clip_grad_norm", None))
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

def add_train_vae(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-vae", help="train the discrete VAE that turns images into tokens",
                       description="Train a discrete VAE (DALLE-pytorch's train_vae.py flags).")
    _add_data_args(p, ["--image_folder", "--image_text_folder"],
                   "folder of images, searched recursively")
    add_flags(p.add_argument_group("VAE"), VAEConfig)
    add_flags(p.add_argument_group("temperature and learning-rate schedule"), VAESchedule)
    _add_train_args(p, VAE_TRAIN_DEFAULTS)
    add_flags(p.add_argument_group("samples"), VAESamples)
    add_flags(p.add_argument_group("validation"), ValidationConfig)
    p.add_argument("--vae_output_file_name", default="vae",
                   help="checkpoint to write; .pt is added when missing (default %(default)s)")
    p.set_defaults(run=run_train_vae)


def run_train_vae(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import train_vae

    vae_cfg = from_args(VAEConfig, args)
    vae_cfg.validate()
    resume = _resume_config(args, flag_values(VAEConfig, args))
    train_cfg = from_args(TrainConfig, args, clip_grad_norm=None)
    data_cfg = from_args(DataConfig, args, image_size=vae_cfg.image_size)
    trackers = from_args(TrackerConfig, args)
    trackers.validate()
    validation = from_args(ValidationConfig, args)
    validation.validate()  # before any process group or file: one line, exit 2
    return run_on_backend(args, lambda backend: train_vae(
        vae_cfg, from_args(VAESchedule, args), train_cfg, data_cfg,
        args.vae_output_file_name, backend, resume=resume, tf32=not args.no_tf32,
        trackers=trackers, samples=from_args(VAESamples, args), validation=validation))


# -- train ---------------------------------------------------------------------------

def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train DALL-E (trains a VAE first on built-in data)",
                       description="Train DALL-E (DALLE-pytorch's train_dalle.py flags). "
                                   "On the built-in shapes, without --vae_path, a VAE is "
                                   "trained first (or taken from the cache).")
    _add_data_args(p, ["--image_text_folder"], "folder of name.png + name.txt pairs")
    p.add_argument("--vae_path", help="trained VAE checkpoint (from dalle-dist train-vae)")
    p.add_argument("--dalle_path", help="DALL-E checkpoint to resume from")
    add_flags(p.add_argument_group("VQGAN image tokenizer (taming-transformers), instead of "
                                   "a VAE"), TamingConfig)
    add_flags(p, TokenizerConfig)
    add_flags(p, DataConfig, only=["truncate_captions"])
    add_flags(p.add_argument_group("validation"), ValidationConfig)
    p.add_argument("--dalle_output_file_name", default="dalle",
                   help="checkpoint to write; .pt is added when missing (default %(default)s)")
    p.add_argument("--fidelity_images", type=int, default=64,
                   help="on built-in data, score this many sampled images at the end "
                        "(0: skip; default %(default)s)")
    model = p.add_argument_group("model")
    add_flags(model, DALLEConfig)
    # --no_tf32: with the training flags
    add_flags(model, ComputeConfig, only=["attn_impl", "activation_checkpointing"])
    _add_train_args(p, TrainConfig())
    add_flags(p, TrainConfig, only=["clip_grad_norm"])
    add_flags(p, ProfileConfig)
    p.add_argument("--lr_decay", action="store_true",
                   help="halve the learning rate when the epoch loss plateaus")
    add_flags(p, VAEConfig, only=["image_size"],
              help={"image_size": "built-in shapes size when a VAE is trained first"})
    p.add_argument("--builtin_vae_epochs", type=int, default=BUILTIN_VAE_TRAIN.epochs,
                   help="epochs of 10,000 shapes for the VAE trained first on built-in data "
                        "without --vae_path; each value is cached on its own (default "
                        "%(default)s: about 2 minutes on 2 CPU cores)")
    p.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import train_dalle

    model_args = flag_values(DALLEConfig, args)
    text_seq_len = model_args.pop("text_seq_len")
    resume = _resume_config(args, {**model_args, "text_seq_len": text_seq_len},
                            "--dalle_path")
    train_cfg = from_args(TrainConfig, args)
    data_cfg = from_args(DataConfig, args, image_size=args.image_size)
    trackers = from_args(TrackerConfig, args)
    trackers.validate()
    validation = from_args(ValidationConfig, args)
    validation.validate()  # before any process group or file: one line, exit 2
    return run_on_backend(args, lambda backend: train_dalle(
        model_args, train_cfg, data_cfg, args.dalle_output_file_name, backend,
        vae_path=args.vae_path, resume=resume, tokenizer_cfg=from_args(TokenizerConfig, args),
        attn_impl=args.attn_impl, text_seq_len=text_seq_len, lr_decay=args.lr_decay,
        fidelity_images=args.fidelity_images, builtin_vae_epochs=args.builtin_vae_epochs,
        tf32=not args.no_tf32, trackers=trackers,
        flops_profiler=from_args(ProfileConfig, args).flops_profiler, validation=validation,
        activation_checkpointing=args.activation_checkpointing,
        taming=from_args(TamingConfig, args)))
