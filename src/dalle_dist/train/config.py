"""Typed training settings, shared by `train-vae` and `train`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dalle_dist.backends.ema import EMASettings
from dalle_dist.config_base import DictConfig, option, optional_float
from dalle_dist.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """The defaults are `train`'s; `train-vae` starts from VAE_TRAIN_DEFAULTS."""

    epochs: int = option(4, "passes over the training data")
    batch_size: int = option(
        32, "samples per optimizer step, over all ranks and micro-batches (horovod: per "
        "worker, DALLE-pytorch's meaning)")
    learning_rate: float = option(
        1e-3, "the optimizer's learning rate (with --lr_schedule: the peak, after any warmup)")
    clip_grad_norm: float | None = option(0.5, "max gradient norm; none to disable",
                                          parse=optional_float)
    save_every_n_steps: int = option(
        1000, "also saved before training, at each epoch end and at the end; 0: only those")
    sample_every_n_steps: int = option(
        500, "write a sample grid PNG beside the checkpoint")
    log_every_n_steps: int = option(10, "metrics JSONL interval")
    seed: int = option(
        42, "seeds the initial weights and the data order; rank r draws dropout and crops "
        "from seed + r")

    def validate(self) -> None:
        if self.epochs <= 0:
            raise ConfigError(f"--epochs must be positive, got {self.epochs}")
        if self.batch_size <= 0:
            raise ConfigError(f"--batch_size must be positive, got {self.batch_size}")
        if self.learning_rate < 0:
            raise ConfigError(f"--learning_rate must not be negative, got {self.learning_rate}")
        if self.clip_grad_norm is not None and self.clip_grad_norm < 0:
            raise ConfigError(f"--clip_grad_norm must not be negative, got {self.clip_grad_norm}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        for name in ("save_every_n_steps", "sample_every_n_steps", "log_every_n_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0 (0 turns it off)")


@dataclass(frozen=True)
class ValidationConfig(DictConfig):
    """The held-out part and how often its loss is measured. Apart from DataConfig and
    TrainConfig, whose dicts make the built-in VAE's cache key: holding data out for the
    DALL-E must not retrain the VAE."""

    val_fraction: float = option(
        0.0, "hold out this fraction of the samples for a validation loss, chosen by a hash "
        "of each sample's name (folder: its path; WebDataset: shard and __key__; built-in: "
        "its index), so the split is the same on every rank, for any rank count and after "
        "a resume; the sample grids draw from it (train: their captions; train-vae: the "
        "images they reconstruct). 0: no validation")
    val_every_n_steps: int = option(
        0, "also measure the validation loss every N optimizer steps (it is always measured "
        "at each epoch end); 0: only at epoch ends", metavar="N")

    def validate(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"--val_fraction must be in [0, 1), got {self.val_fraction}",
                              "e.g. 0.05 holds out about 5% of the samples; 0 holds out none")
        if self.val_every_n_steps < 0:
            raise ConfigError(f"--val_every_n_steps must be >= 0, got {self.val_every_n_steps}",
                              "0 measures only at epoch ends")
        if self.val_every_n_steps and not self.val_fraction:
            raise ConfigError("--val_every_n_steps needs --val_fraction",
                              "hold some data out, e.g. --val_fraction 0.05")


def betas(text: str) -> tuple[float, float]:
    """`0.9,0.95` -> (0.9, 0.95): Adam's two moment decay rates."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"two comma-separated numbers, got {text!r}")
    return float(parts[0]), float(parts[1])


OPTIMIZERS = ("adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "linear", "plateau")
#: AdamW's weight decay when --weight_decay is not given (torch's default); Adam's is 0
ADAMW_WEIGHT_DECAY = 0.01
#: plateau's floor when --min_lr is not given (DALLE-pytorch's ReduceLROnPlateau); the
#: decays' floor is 0
PLATEAU_MIN_LR = 1e-6


@dataclass(frozen=True)
class OptimizerConfig(DictConfig):
    """`train`'s optimizer and learning-rate schedule. Saved in the checkpoint (configs
    "optimizer"); a resumed run must keep them, so that its learning rate at every step is
    the uninterrupted run's. Apart from TrainConfig, whose dict is the built-in VAE's
    cache key."""

    optimizer: str = option(
        "adam", "adam, or adamw: weight decay applied to the weights directly, not through "
        "the gradient (decoupled); either one fused on CPU and CUDA", choices=OPTIMIZERS,
        group="optimizer and learning-rate schedule")
    weight_decay: float | None = option(
        None, "weight decay of the Linear weights (norms, biases and embeddings are never "
        "decayed)", metavar="W", parse=optional_float,
        default_text=f"default: 0 for adam, {ADAMW_WEIGHT_DECAY} for adamw",
        group="optimizer and learning-rate schedule")
    betas: tuple[float, float] = option(
        (0.9, 0.999), "Adam's moment decay rates beta1,beta2 (LlamaGen: 0.9,0.95)",
        metavar="B1,B2", parse=betas, group="optimizer and learning-rate schedule")
    lr_schedule: str | None = option(
        None, "constant; cosine or linear: from --learning_rate down to --min_lr over the "
        "run's optimizer steps after the warmup; plateau: halve the rate when the epoch "
        "loss stops falling (DALLE-pytorch's --lr_decay)", choices=LR_SCHEDULES,
        metavar="|".join(LR_SCHEDULES),
        default_text="default: constant, plateau with --lr_decay",
        group="optimizer and learning-rate schedule")
    warmup_steps: int = option(
        0, "raise the rate linearly from --learning_rate / N to --learning_rate over the "
        "first N optimizer steps (counted in optimizer steps: --ga_steps does not change "
        "it)", metavar="N", group="optimizer and learning-rate schedule")
    min_lr: float | None = option(
        None, "the rate cosine and linear end at, and plateau's floor", metavar="LR",
        default_text=f"default: 0 for cosine and linear, {PLATEAU_MIN_LR} for plateau",
        group="optimizer and learning-rate schedule")

    def validate(self) -> None:
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ConfigError(f"--weight_decay must not be negative, got {self.weight_decay}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"--betas must be two numbers in [0, 1), got "
                              f"{','.join(map(str, self.betas))}", "e.g. --betas 0.9,0.95")
        if self.warmup_steps < 0:
            raise ConfigError(f"--warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.min_lr is not None and self.min_lr < 0:
            raise ConfigError(f"--min_lr must not be negative, got {self.min_lr}")
        if self.warmup_steps and self.lr_schedule == "plateau":
            raise ConfigError("--warmup_steps cannot be combined with --lr_schedule plateau: "
                              "the plateau decay sets the rate itself at epoch ends",
                              "use --lr_schedule cosine or linear with a warmup")
        if self.min_lr is not None and self.lr_schedule in (None, "constant"):
            raise ConfigError("--min_lr needs --lr_schedule cosine, linear or plateau",
                              "a constant rate has no floor to reach")

    def resolved(self, lr_decay: bool, learning_rate: float) -> OptimizerConfig:
        """Every default filled in: the schedule (DALLE-pytorch's --lr_decay is plateau),
        the weight decay and the floor. Refuses what contradicts --lr_decay or
        --learning_rate."""
        schedule = self.lr_schedule or ("plateau" if lr_decay else "constant")
        if lr_decay and schedule != "plateau":
            raise ConfigError(f"--lr_decay is --lr_schedule plateau, not {schedule}",
                              "give one of them")
        weight_decay = self.weight_decay if self.weight_decay is not None else (
            ADAMW_WEIGHT_DECAY if self.optimizer == "adamw" else 0.0)
        min_lr = self.min_lr if self.min_lr is not None else (
            PLATEAU_MIN_LR if schedule == "plateau" else 0.0 if schedule != "constant"
            else None)
        if min_lr is not None and min_lr > learning_rate:
            raise ConfigError(f"--min_lr {min_lr:g} is above --learning_rate {learning_rate:g}",
                              "the schedule decays towards --min_lr")
        return replace(self, lr_schedule=schedule, weight_decay=weight_decay, min_lr=min_lr)


@dataclass(frozen=True)
class EMAConfig(DictConfig):
    """`train --ema_decay`: an exponential moving average of the weights, which sample
    grids, validation, the fidelity check and `generate` use (backends/ema.py). Saved in
    the checkpoint (configs "ema") with the average itself."""

    ema_decay: float | None = option(
        None, "keep an exponential moving average of the weights with this decay (0.999 to "
        "0.9999 for long runs: it averages about 1 / (1 - D) updates) and sample from it; "
        "off by default", metavar="D", parse=optional_float, group="EMA weights")
    ema_start_step: int = option(
        0, "the average is the weights themselves up to this optimizer step, then starts "
        "averaging (skips the fast-moving first steps)", metavar="N", group="EMA weights")
    ema_every: int = option(
        1, "average every N optimizer steps (each update still uses --ema_decay)",
        metavar="N", group="EMA weights")

    def validate(self) -> None:
        if self.ema_decay is None:
            if self.ema_start_step or self.ema_every != 1:
                raise ConfigError("--ema_start_step and --ema_every need --ema_decay",
                                  "add --ema_decay, e.g. --ema_decay 0.999")
            return
        if not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"--ema_decay must be in (0, 1), got {self.ema_decay:g}",
                              "e.g. --ema_decay 0.999")
        if self.ema_start_step < 0:
            raise ConfigError(f"--ema_start_step must be >= 0, got {self.ema_start_step}")
        if self.ema_every < 1:
            raise ConfigError(f"--ema_every must be >= 1, got {self.ema_every}")

    def settings(self) -> EMASettings | None:
        """What the engine's EMA runs with; None without --ema_decay."""
        if self.ema_decay is None:
            return None
        return EMASettings(self.ema_decay, self.ema_start_step, self.ema_every)


@dataclass(frozen=True)
class QualityConfig(DictConfig):
    """`train --eval_every_n_steps`: images sampled for fixed captions at a cadence and
    scored offline, from files the user gives (train/quality.py). Nothing is downloaded:
    many clusters cannot, and a metric must not depend on it."""

    eval_every_n_steps: int = option(
        0, "every N optimizer steps and at the end, sample --eval_images images for the "
        "evaluation captions (--eval_captions, else the held-out ones of --val_fraction, "
        "else the built-in data's held-out scenes, else a fixed list of 16) and log their "
        "FID (--fid_weights), CLIP score (--clip_dir) and, on built-in data, caption "
        "fidelity; 0: off", metavar="N",
        group="image-quality metrics")
    eval_images: int = option(
        64, "images per evaluation (FID needs 2 or more; its value depends on the count: "
        "compare runs at equal counts)", metavar="N", group="image-quality metrics")
    fid_weights: str | None = option(
        None, "FID from this local Inception file: torch-fidelity's / pytorch-fid's "
        "weights-inception-2015-12-05-6726825d.pth, or a TorchScript or torch.export module "
        "mapping uint8 images [N, 3, H, W] to features [N, D] (clean-fid's "
        "inception-2015-12-05.pt); the real images are the held-out ones",
        metavar="PATH", group="image-quality metrics")
    clip_dir: str | None = option(
        None, "CLIP score from this local Hugging Face CLIP directory (config.json, weights, "
        "tokenizer; e.g. a saved openai/clip-vit-base-patch32); needs transformers",
        metavar="PATH", group="image-quality metrics")
    eval_captions: str | None = option(
        None, "a text file of evaluation captions, one per line (the first --eval_images)",
        metavar="PATH", group="image-quality metrics")

    @property
    def measures(self) -> bool:
        return self.eval_every_n_steps > 0

    def validate(self) -> None:
        if self.eval_every_n_steps < 0:
            raise ConfigError(f"--eval_every_n_steps must be >= 0, got "
                              f"{self.eval_every_n_steps}", "0 turns the evaluation off")
        given = [flag for flag, value in (("--fid_weights", self.fid_weights),
                                          ("--clip_dir", self.clip_dir),
                                          ("--eval_captions", self.eval_captions)) if value]
        if given and not self.measures:
            raise ConfigError(f"{given[0]} needs --eval_every_n_steps",
                              "e.g. --eval_every_n_steps 1000")
        minimum = 2 if self.fid_weights else 1
        if self.eval_images < minimum:
            raise ConfigError(f"--eval_images must be >= {minimum}"
                              + (" with --fid_weights (FID needs a covariance)"
                                 if self.fid_weights else "") + f", got {self.eval_images}")


#: train-vae: DALLE-pytorch's train_vae.py clips nothing
VAE_TRAIN_DEFAULTS = TrainConfig(epochs=5, clip_grad_norm=None)


@dataclass(frozen=True)
class ResumeConfig:
    """Where a run continues from, and how many checkpoints it keeps."""

    #: "auto" (newest beside the output) or a checkpoint path
    source: str | None = option(
        None, "continue a run: auto takes the newest complete checkpoint of the output name "
        "(starting fresh when there is none), PATH a given checkpoint file, sharded or "
        "DeepSpeed directory; weights, optimizer, scheduler, RNG and data position are "
        "restored",
        name="--resume", metavar="auto|PATH", default_text="default: a new run")
    flag: str = "--resume"  # the flag that named it (--dalle_path is DALLE-pytorch's)
    keep_n_checkpoints: int | None = option(
        None, "keep the newest N saves: NAME-checkpoints/step-*.pt, NAME-sharded/step-*, or "
        "the DeepSpeed tags", metavar="N",
        default_text="default: only the newest file or sharded save, and every DeepSpeed tag")
    checkpoint_format: str | None = option(
        None, "full: one file NAME.pt, gathered on rank 0; sharded: NAME-sharded/, each rank "
        "writing its own shards (torch.distributed.checkpoint), resumable at another world "
        "size or on another backend. DeepSpeed always writes its own directory NAME-ds-cp/",
        choices=("full", "sharded"), metavar="full|sharded",
        default_text="default: sharded for fsdp, DeepSpeed's directory for deepspeed, "
        "full otherwise")
    async_checkpoint: bool = option(
        False, "write sharded checkpoints in the background: the steps go on while each "
        "rank's copy of its shards is written (one more copy in host memory); the next "
        "save and the end of the run wait for it")
    #: start over even where the output name holds a checkpoint (--overwrite)
    overwrite: bool = option(
        False, "start over where the output name already holds a checkpoint (without it such "
        "a run stops: continue it with --resume auto); the old one is removed once the new "
        "run's first save is complete")
    #: model flags given on the command line: they must agree with a resumed checkpoint
    given_model: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.overwrite and self.source == "auto":
            raise ConfigError("--overwrite and --resume auto contradict each other",
                              "--resume auto continues the output's checkpoint, --overwrite "
                              "replaces it: give one of them")
        if self.keep_n_checkpoints is not None and self.keep_n_checkpoints < 1:
            raise ConfigError(f"--keep_n_checkpoints must be >= 1, got "
                              f"{self.keep_n_checkpoints}", "leave it out to keep only the "
                              "newest single file and every DeepSpeed tag")


@dataclass(frozen=True)
class VAESchedule(DictConfig):
    """Gumbel temperature annealing and learning-rate decay, applied every `anneal_every` steps.

    temperature = max(starting_temp * exp(-anneal_rate * step), temp_min)
    """

    starting_temp: float = option(1.0, "Gumbel-softmax temperature at the first step")
    temp_min: float = option(0.5, "the lowest temperature the annealing reaches")
    anneal_rate: float = option(
        1e-3, "temperature = max(starting_temp * exp(-anneal_rate * step), temp_min)")
    lr_decay_rate: float = option(0.98, "learning rate x this every 100 steps")
    anneal_every: int = 100

    def validate(self) -> None:
        if self.starting_temp <= 0 or self.temp_min <= 0:
            raise ConfigError("--starting_temp and --temp_min must be positive")
        if self.anneal_rate < 0:
            raise ConfigError("--anneal_rate must not be negative")
        if not 0 < self.lr_decay_rate <= 1:
            raise ConfigError(f"--lr_decay_rate must be in (0, 1], got {self.lr_decay_rate}")
        if self.anneal_every <= 0:
            raise ConfigError("--anneal_every must be positive")

    def temperature(self, step: int) -> float:
        """The temperature in force after `step` steps (derived, so resuming needs no state)."""
        applied = step // self.anneal_every * self.anneal_every
        return max(self.starting_temp * pow(2.718281828459045, -self.anneal_rate * applied),
                   self.temp_min)


@dataclass(frozen=True)
class VAESamples:
    """What train-vae's sample grids show (not stored: it changes no training)."""

    num_images_save: int = option(
        8, "images in each sample grid: a row of originals, one of soft and one of hard "
        "(codebook) reconstructions (DALLE-pytorch's default is 4)")

    def validate(self) -> None:
        if self.num_images_save < 1:
            raise ConfigError(f"--num_images_save must be at least 1, got "
                              f"{self.num_images_save}", "the sample grids show that many "
                              "images; --sample_every_n_steps 0 turns the grids off")


#: epochs of the VAE `train` trains first on built-in data (--builtin_vae_epochs)
BUILTIN_VAE_EPOCHS = 5


@dataclass(frozen=True)
class DalleRun(DictConfig):
    """`train`'s own inputs and outputs: the image tokenizer to train on, DALLE-pytorch's
    resume spelling, the output name, the learning-rate decay and the built-in data's
    extras (the VAE trained first and the fidelity score at the end)."""

    vae_path: str | None = option(
        None, "trained VAE checkpoint (from dalle-dist train-vae) that turns the images into "
        "tokens", metavar="PATH", default_text="default: on built-in data a cached VAE, "
        "trained first when there is none")
    dalle_path: str | None = option(
        None, "DALL-E checkpoint to continue from (DALLE-pytorch's flag; the same as "
        "--resume PATH)", metavar="PATH", default_text="default: a new run")
    dalle_output_file_name: str = option(
        "dalle", "checkpoint to write; .pt is added when missing, and the metrics, loss plot "
        "and sample grids are named after it", metavar="NAME")
    fidelity_images: int = option(
        64, "on built-in data, sample this many images at the end and print the fraction "
        "whose shape, colour and position match their caption (0: skip)", metavar="N")
    lr_decay: bool = option(
        False, "halve the learning rate when the epoch loss plateaus (DALLE-pytorch's "
        "ReduceLROnPlateau; the same as --lr_schedule plateau)")
    builtin_vae_epochs: int = option(
        BUILTIN_VAE_EPOCHS, "epochs of the built-in shapes for the VAE trained first on "
        "built-in data without --vae_path; each value is cached on its own", metavar="N")

    def validate(self) -> None:
        if self.fidelity_images < 0:
            raise ConfigError("--fidelity_images must be >= 0 (0 skips the evaluation)")
        if self.builtin_vae_epochs < 1:
            raise ConfigError(f"--builtin_vae_epochs must be >= 1, got {self.builtin_vae_epochs}")


@dataclass(frozen=True)
class VAERun(DictConfig):
    """`train-vae`'s output name."""

    vae_output_file_name: str = option(
        "vae", "checkpoint to write; .pt is added when missing, and the metrics, loss plot "
        "and sample grids are named after it", metavar="NAME")


@dataclass(frozen=True)
class RunPaths:
    """Where a run writes: the checkpoint, its metrics and its sample grids, side by side."""

    checkpoint: Path

    @classmethod
    def for_output(cls, name: str) -> RunPaths:
        """DALLE-pytorch's --*_output_file_name takes "dalle" or "dalle.pt"."""
        path = Path(name)
        if path.suffix != ".pt":
            path = path.with_name(path.name + ".pt")
        return cls(path)

    @property
    def metrics(self) -> Path:
        return self.checkpoint.with_suffix(".metrics.jsonl")

    @property
    def samples(self) -> Path:
        return self.checkpoint.with_name(self.checkpoint.stem + "-samples")

    @property
    def loss_plot(self) -> Path:
        """NAME-loss.png, beside NAME-samples/: redrawn from the metrics at every save."""
        return self.checkpoint.with_name(self.checkpoint.stem + "-loss.png")


#: DALLE-pytorch's W&B project when --wandb_name is not given (its train_dalle.py default)
WANDB_DEFAULT_PROJECT = "dalle_train_transformer"


@dataclass(frozen=True)
class TrackerConfig(DictConfig):
    """Experiment trackers the root rank feeds besides NAME.metrics.jsonl (train/trackers.py).

    DALLE-pytorch always logs to W&B; here it is on when --wandb_name or --wandb_entity is
    given, so a run without either needs no account, no package and no network.
    """

    wandb_name: str | None = option(
        None, "log config, metrics and sample grids to Weights & Biases under this project "
        "(DALLE-pytorch's flag: it names the W&B project); offline, with a `wandb sync` line, "
        "when no API key or no network is found; needs the wandb extra",
        metavar="PROJECT", default_text=f"default: W&B off; {WANDB_DEFAULT_PROJECT} when only "
        "--wandb_entity is given", group="trackers")
    wandb_entity: str | None = option(
        None, "W&B team or user to log to (turns W&B on, like --wandb_name)",
        metavar="ENTITY", default_text="default: your W&B default entity", group="trackers")
    tensorboard_dir: str | None = option(
        None, "write TensorBoard event files (metrics and sample grids) here; needs the "
        "tensorboard extra", metavar="DIR", default_text="default: off", group="trackers")

    @property
    def wandb(self) -> bool:
        return self.wandb_name is not None or self.wandb_entity is not None

    @property
    def wandb_project(self) -> str:
        return self.wandb_name or WANDB_DEFAULT_PROJECT

    def validate(self) -> None:
        """Refuse what cannot work before anything is written: empty names, a missing
        package (imported only here and by the tracker, never by `import dalle_dist`)."""
        import importlib.util

        for flag, value in (("--wandb_name", self.wandb_name),
                            ("--wandb_entity", self.wandb_entity),
                            ("--tensorboard_dir", self.tensorboard_dir)):
            if value is not None and not value.strip():
                raise ConfigError(f"{flag} is empty", f"give a name, or leave {flag} out")
        if self.wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError("--wandb_name/--wandb_entity need Weights & Biases, which is not "
                              "installed", "pip install 'dalle_dist[wandb]', or leave the "
                              "W&B flags out")
        if self.tensorboard_dir is not None:
            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("--tensorboard_dir needs TensorBoard, which is not installed",
                                  "pip install 'dalle_dist[tensorboard]', or leave "
                                  "--tensorboard_dir out")
            path = Path(self.tensorboard_dir)
            if path.exists() and not path.is_dir():
                raise ConfigError(f"--tensorboard_dir {path} is a file, not a folder",
                                  "give a folder (it is created when missing)")


@dataclass(frozen=True)
class ProfileConfig(DictConfig):
    """`train --flops_profiler`: measure one step instead of training (train/flops.py)."""

    flops_profiler: bool = option(
        False, "count the FLOPs of one forward and backward per top-level module, time the "
        "step, print achieved FLOP/s and MFU against a measured matmul peak, then exit 0 "
        "without training or saving (DALLE-pytorch's flag; every backend)")
