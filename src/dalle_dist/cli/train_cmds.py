"""Flags of `train-vae` and `train`, named as in DALLE-pytorch's train_vae.py / train_dalle.py.

Defaults are sized for the built-in shapes on a CPU (`make demo`); DALLE-pytorch's own
defaults (dim 512, 8192 VAE tokens, 128px ...) target real data on GPUs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dalle_dist.backends import DistributedBackend, add_backend_arguments, backend_from_args
from dalle_dist.cli.exits import report_and_exit
from dalle_dist.cli.parser import optional_float
from dalle_dist.data import DataConfig
from dalle_dist.errors import ConfigError, PeerLost
from dalle_dist.model import ATTN_IMPLS, PATTERNS, VAEConfig
from dalle_dist.train.builtin_vae import BUILTIN_VAE_TRAIN
from dalle_dist.train.config import ResumeConfig, TrainConfig, VAESchedule

_VAE = VAEConfig()
_SCHEDULE = VAESchedule()
_DATA = DataConfig()


def _add_data_args(parser: argparse.ArgumentParser, folder_flags: list[str], help_text: str,
                   ) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(*folder_flags, dest="image_text_folder", default=None, help=help_text)
    group.add_argument("--wds", default=None, metavar="IMG,CAP",
                       help="the folder (or brace pattern) holds WebDataset .tar shards; name "
                            "the image and caption member extensions, e.g. jpg,txt")
    group.add_argument("--random_resize_crop_lower_ratio", dest="resize_ratio", type=float,
                       default=_DATA.resize_ratio,
                       help="random square crops keep at least this fraction of the area "
                            "(default %(default)s)")
    group.add_argument("--shapes_count", type=int, default=_DATA.shapes_count,
                       help="images per epoch of the built-in shapes (default %(default)s)")
    group.add_argument("--shapes_seed", type=int, default=_DATA.shapes_seed,
                       help="seed of the built-in shapes (default %(default)s)")
    group.add_argument("--num_workers", type=int, default=_DATA.num_workers,
                       help="data loader processes (default %(default)s: load in the main one)")


def _add_train_args(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=int, default=defaults.epochs,
                       help="default %(default)s")
    group.add_argument("--batch_size", type=int, default=defaults.batch_size,
                       help="default %(default)s")
    group.add_argument("--learning_rate", type=float, default=defaults.learning_rate,
                       help="default %(default)s")
    group.add_argument("--save_every_n_steps", type=int, default=defaults.save_every_n_steps,
                       help="also saved before training, at each epoch end and at the end; "
                            "0: only those (default %(default)s)")
    group.add_argument("--sample_every_n_steps", type=int,
                       default=defaults.sample_every_n_steps,
                       help="write a sample grid PNG beside the checkpoint (default %(default)s)")
    group.add_argument("--log_every_n_steps", type=int, default=defaults.log_every_n_steps,
                       help="metrics JSONL interval (default %(default)s)")
    group.add_argument("--seed", type=int, default=defaults.seed, help="default %(default)s")
    group.add_argument("--resume", default=None, metavar="auto|PATH",
                       help="continue a run: auto takes the newest complete checkpoint of the "
                            "output name (starting fresh when there is none), PATH a given "
                            "checkpoint file or DeepSpeed directory; weights, optimizer, "
                            "scheduler, RNG and data position are restored")
    group.add_argument("--overwrite", action="store_true",
                       help="start over where the output name already holds a checkpoint "
                            "(without it such a run stops: continue it with --resume auto); "
                            "the old one is removed once the new run's first save is complete")
    group.add_argument("--keep_n_checkpoints", type=int, default=None, metavar="N",
                       help="keep the newest N saves: NAME-checkpoints/step-*.pt, or the "
                            "DeepSpeed tags (default: only NAME.pt, and every DeepSpeed tag)")
    group.add_argument("--device", default=None,
                       help="cpu, cuda or cuda:N (default: the rank's GPU when there is one, "
                            "else cpu)")
    add_backend_arguments(parser)


def _train_config(args: argparse.Namespace, clip: float | None) -> TrainConfig:
    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size,
                       learning_rate=args.learning_rate, clip_grad_norm=clip,
                       save_every_n_steps=args.save_every_n_steps,
                       sample_every_n_steps=args.sample_every_n_steps,
                       log_every_n_steps=args.log_every_n_steps, seed=args.seed)


def _data_config(args: argparse.Namespace, image_size: int) -> DataConfig:
    return DataConfig(image_text_folder=args.image_text_folder, wds=args.wds,
                      image_size=image_size,
                      truncate_captions=getattr(args, "truncate_captions", False),
                      resize_ratio=args.resize_ratio, shapes_count=args.shapes_count,
                      shapes_seed=args.shapes_seed, num_workers=args.num_workers)


def _resume_config(args: argparse.Namespace, model: dict[str, object],
                   path_flag: str | None = None) -> ResumeConfig:
    """--resume (or DALLE-pytorch's --dalle_path) and the model flags the user typed."""
    path = getattr(args, path_flag.lstrip("-"), None) if path_flag else None
    if path and args.resume:
        raise ConfigError(f"--resume and {path_flag} both name a checkpoint", "give one of them")
    given = {key: value for key, value in model.items() if key in args.given}
    if args.overwrite and args.resume == "auto":
        raise ConfigError("--overwrite and --resume auto contradict each other",
                          "--resume auto continues the output's checkpoint, --overwrite "
                          "replaces it: give one of them")
    return ResumeConfig(source=path or args.resume,
                        flag=path_flag if path else "--resume",
                        keep_n_checkpoints=args.keep_n_checkpoints, given_model=given,
                        overwrite=args.overwrite)


def run_on_backend(args: argparse.Namespace, command: Callable[[DistributedBackend], None]
                   ) -> int:
    """Choose and join the backend, run the command on it, leave the process group.

    Every wait for the other ranks is bounded by --collective_timeout (backends/watch.py);
    after a peer is lost the group is not left politely: leaving could wait for it too.
    """
    backend = backend_from_args(args)
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

VAE_TRAIN_DEFAULTS = TrainConfig(epochs=5, batch_size=32, learning_rate=1e-3,
                                 clip_grad_norm=None, sample_every_n_steps=500)


def add_train_vae(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-vae", help="train the discrete VAE that turns images into tokens",
                       description="Train a discrete VAE (DALLE-pytorch's train_vae.py flags).")
    _add_data_args(p, ["--image_folder", "--image_text_folder"],
                   "folder of images, searched recursively (default: built-in shapes)")
    model = p.add_argument_group("VAE")
    model.add_argument("--image_size", type=int, default=_VAE.image_size,
                       help="default %(default)s")
    model.add_argument("--num_tokens", type=int, default=_VAE.num_tokens,
                       help="codebook size (default %(default)s)")
    model.add_argument("--num_layers", type=int, default=_VAE.num_layers,
                       help="downsampling layers: tokens = (image_size / 2^num_layers)^2 "
                            "(default %(default)s)")
    model.add_argument("--num_resnet_blocks", type=int, default=_VAE.num_resnet_blocks,
                       help="default %(default)s")
    model.add_argument("--emb_dim", type=int, default=_VAE.codebook_dim,
                       help="codebook dimension (default %(default)s)")
    model.add_argument("--hidden_dim", type=int, default=_VAE.hidden_dim,
                       help="default %(default)s")
    model.add_argument("--kl_loss_weight", type=float, default=_VAE.kl_loss_weight,
                       help="default %(default)s")
    model.add_argument("--smooth_l1_loss", action="store_true",
                       help="reconstruction loss smooth L1 instead of MSE")
    model.add_argument("--straight_through", action="store_true",
                       help="hard Gumbel-softmax samples with straight-through gradients")
    sched = p.add_argument_group("temperature and learning-rate schedule")
    sched.add_argument("--starting_temp", type=float, default=_SCHEDULE.starting_temp,
                       help="default %(default)s")
    sched.add_argument("--temp_min", type=float, default=_SCHEDULE.temp_min,
                       help="default %(default)s")
    sched.add_argument("--anneal_rate", type=float, default=_SCHEDULE.anneal_rate,
                       help="temperature = max(starting_temp * exp(-anneal_rate * step), "
                            "temp_min) (default %(default)s)")
    sched.add_argument("--lr_decay_rate", type=float, default=_SCHEDULE.lr_decay_rate,
                       help="learning rate x this every 100 steps (default %(default)s)")
    _add_train_args(p, VAE_TRAIN_DEFAULTS)
    p.add_argument("--vae_output_file_name", default="vae",
                   help="checkpoint to write; .pt is added when missing (default %(default)s)")
    p.set_defaults(run=run_train_vae)


def run_train_vae(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import train_vae

    vae_cfg = VAEConfig(image_size=args.image_size, num_tokens=args.num_tokens,
                        codebook_dim=args.emb_dim, num_layers=args.num_layers,
                        num_resnet_blocks=args.num_resnet_blocks, hidden_dim=args.hidden_dim,
                        smooth_l1_loss=args.smooth_l1_loss, kl_loss_weight=args.kl_loss_weight,
                        straight_through=args.straight_through)
    schedule = VAESchedule(starting_temp=args.starting_temp, temp_min=args.temp_min,
                           anneal_rate=args.anneal_rate, lr_decay_rate=args.lr_decay_rate)
    vae_cfg.validate()
    typed = {**vars(args), "codebook_dim": args.emb_dim}
    args.given = {"codebook_dim" if d == "emb_dim" else d for d in getattr(args, "given", ())}
    resume = _resume_config(args, {k: typed[k] for k in vae_cfg.to_dict() if k in typed})
    return run_on_backend(args, lambda backend: train_vae(
        vae_cfg, schedule, _train_config(args, None), _data_config(args, args.image_size),
        args.vae_output_file_name, backend, resume=resume))


# -- train ---------------------------------------------------------------------------

DALLE_TRAIN_DEFAULTS = TrainConfig(epochs=4, batch_size=32, learning_rate=1e-3,
                                   clip_grad_norm=0.5, sample_every_n_steps=500)


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train DALL-E (trains a VAE first on built-in data)",
                       description="Train DALL-E (DALLE-pytorch's train_dalle.py flags). "
                                   "On the built-in shapes, without --vae_path, a VAE is "
                                   "trained first (or taken from the cache).")
    _add_data_args(p, ["--image_text_folder"],
                   "folder of name.png + name.txt pairs (default: built-in shapes)")
    p.add_argument("--vae_path", help="trained VAE checkpoint (from dalle-dist train-vae)")
    p.add_argument("--dalle_path", help="DALL-E checkpoint to resume from")
    p.add_argument("--bpe_path", help="HuggingFace tokenizers JSON (default: byte-level)")
    p.add_argument("--truncate_captions", action="store_true",
                   help="cut captions longer than --text_seq_len instead of stopping")
    p.add_argument("--dalle_output_file_name", default="dalle",
                   help="checkpoint to write; .pt is added when missing (default %(default)s)")
    p.add_argument("--fidelity_images", type=int, default=64,
                   help="on built-in data, score this many sampled images at the end "
                        "(0: skip; default %(default)s)")
    model = p.add_argument_group("model")
    model.add_argument("--dim", type=int, default=128, help="default %(default)s")
    model.add_argument("--depth", type=int, default=4, help="default %(default)s")
    model.add_argument("--heads", type=int, default=4, help="default %(default)s")
    model.add_argument("--dim_head", type=int, default=32, help="default %(default)s")
    model.add_argument("--ff_mult", type=int, default=4, help="default %(default)s")
    model.add_argument("--text_seq_len", type=int, default=48,
                       help="caption tokens (bytes with the default tokenizer; "
                            "default %(default)s)")
    model.add_argument("--attn_types", default="full",
                       help="comma list of attention patterns cycled over layers: "
                            f"{', '.join(PATTERNS)} (default %(default)s)")
    model.add_argument("--attn_impl", choices=ATTN_IMPLS, default="auto",
                       help="how attention is computed: auto picks the fastest correct path "
                            "for the device (default %(default)s)")
    model.add_argument("--conv_kernel_size", type=int, default=5,
                       help="conv_like window side, odd (default %(default)s)")
    model.add_argument("--conv_dilation", type=int, default=1,
                       help="conv_like window dilation (default %(default)s)")
    model.add_argument("--sparse_random_blocks", type=int, default=None,
                       help="sparse: random 16-token blocks per block (default: a quarter of "
                            "the sequence's blocks, as DALLE-pytorch)")
    model.add_argument("--sparse_seed", type=int, default=0,
                       help="seed of the sparse layout's random blocks (default %(default)s)")
    model.add_argument("--stable_softmax", action="store_true",
                       help="DALLE-pytorch's stable softmax: max-normalised output before the "
                            "logits and a stabler softmax in the dense and gather paths")
    model.add_argument("--loss_img_weight", type=float, default=7.0,
                       help="default %(default)s")
    model.add_argument("--attn_dropout", type=float, default=0.0, help="default %(default)s")
    model.add_argument("--ff_dropout", type=float, default=0.0, help="default %(default)s")
    _add_train_args(p, DALLE_TRAIN_DEFAULTS)
    p.add_argument("--clip_grad_norm", type=optional_float, default=0.5,
                   help="max gradient norm; none to disable (default %(default)s)")
    p.add_argument("--lr_decay", action="store_true",
                   help="halve the learning rate when the epoch loss plateaus")
    p.add_argument("--image_size", type=int, default=_VAE.image_size,
                   help="built-in shapes size when a VAE is trained first (default %(default)s)")
    p.add_argument("--builtin_vae_epochs", type=int, default=BUILTIN_VAE_TRAIN.epochs,
                   help="epochs of 10,000 shapes for the VAE trained first on built-in data "
                        "without --vae_path; each value is cached on its own (default "
                        "%(default)s: about 2 minutes on 2 CPU cores)")
    p.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from dalle_dist.train.commands import train_dalle

    model_args = dict(conv_kernel_size=args.conv_kernel_size, conv_dilation=args.conv_dilation,
                      sparse_random_blocks=args.sparse_random_blocks,
                      sparse_seed=args.sparse_seed, stable_softmax=args.stable_softmax,
                      dim=args.dim, depth=args.depth, heads=args.heads, dim_head=args.dim_head,
                      ff_mult=args.ff_mult, attn_dropout=args.attn_dropout,
                      ff_dropout=args.ff_dropout, loss_img_weight=args.loss_img_weight,
                      attn_types=tuple(t.strip() for t in args.attn_types.split(",") if t.strip()))
    resume = _resume_config(args, {**model_args, "text_seq_len": args.text_seq_len},
                            "--dalle_path")
    return run_on_backend(args, lambda backend: train_dalle(
        model_args, _train_config(args, args.clip_grad_norm),
        _data_config(args, args.image_size), args.dalle_output_file_name, backend,
        vae_path=args.vae_path, resume=resume, bpe_path=args.bpe_path,
        attn_impl=args.attn_impl,
        text_seq_len=args.text_seq_len, lr_decay=args.lr_decay,
        fidelity_images=args.fidelity_images, builtin_vae_epochs=args.builtin_vae_epochs))
