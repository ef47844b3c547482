"""A training run as one object: the config sections a command's flags fill, composed.

As torchtitan's JobConfig: each section is a dataclass whose fields are flags
(config_base.option), the CLI fills every section from one parse, and `validate()` checks
each section and what they say together before any process group is joined or any file is
written. `train_dalle(job, backend)` and `train_vae(job, backend)` read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.data.config import DataConfig, TokenizerConfig
from dalle_dist.errors import ConfigError
from dalle_dist.model.config import ComputeConfig, VAEConfig, check_shared_ids
from dalle_dist.model.patterns import PatternOptions, build_pattern
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

#: The DALL-E fields that pick attention-pattern knobs (PatternOptions's)
_PATTERN_KNOBS = ("conv_kernel_size", "conv_dilation", "sparse_random_blocks", "sparse_seed")


@dataclass(frozen=True)
class TrainJob:
    """Everything `dalle-dist train` reads.

    model: DALLEConfig's flag fields only; the vocabulary and the image tokens come from
    the tokenizer and the VAE (or the checkpoint continued), so the full DALLEConfig is
    built once they are loaded.
    """

    model: dict[str, Any] = field(default_factory=dict)
    run: DalleRun = field(default_factory=DalleRun)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    taming: TamingConfig = field(default_factory=TamingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)

    @property
    def continues(self) -> ResumeConfig:
        """The resume choice with DALLE-pytorch's --dalle_path folded into --resume."""
        if self.run.dalle_path:
            return replace(self.resume, source=self.run.dalle_path, flag="--dalle_path")
        return self.resume

    def validate(self) -> None:
        """Every check that needs no device, no file and no other rank: one `error:` line
        before anything starts."""
        for section in (self.run, self.train, self.resume, self.trackers, self.validation,
                        self.taming, self.compute, self.optim, self.ema, self.quality):
            section.validate()
        self._check_quality()
        self.optim.resolved(self.run.lr_decay, self.train.learning_rate)  # its refusals
        if self.compute.compile and self.profile.flops_profiler:
            raise ConfigError("--flops_profiler cannot count a compiled step: its FLOP "
                              "counter runs the ops one by one, and torch.compile's graphs do "
                              "not run under it", "drop --compile; bench/compile_speedup.py "
                              "times compiled steps against eager ones")
        if self.run.dalle_path and self.resume.source:
            raise ConfigError("--resume and --dalle_path both name a checkpoint",
                              "give one of them")
        if self.data.token_shards and (self.data.image_text_folder or self.data.wds):
            raise ConfigError("--token_shards replaces --image_text_folder and --wds",
                              "give only the token shards' folder")
        resume = self.continues
        if self.run.vae_path and self.taming.wanted:
            raise ConfigError("--vae_path and --taming/--vqgan_* both name the image tokenizer",
                              "give a dalle-dist VAE with --vae_path, or a taming VQGAN with "
                              "--vqgan_model_path and --vqgan_config_path")
        if self.run.vae_path and resume.source and resume.source != "auto":
            raise ConfigError(f"--vae_path and {resume.flag} cannot be combined",
                              "a DALL-E checkpoint carries its VAE; drop --vae_path")
        options = PatternOptions(**{k: self.model[k] for k in _PATTERN_KNOBS
                                    if k in self.model})
        for name in self.model.get("attn_types", ()):
            build_pattern(name, options)
        if resume.source is None:  # a resumed model's depth is the checkpoint's: checked later
            check_shared_ids(self.model.get("depth", 0), self.model.get("attn_types", ()),
                             self.model.get("shared_attn_ids"), self.model.get("shared_ff_ids"))

    def _check_quality(self) -> None:
        """--eval_every_n_steps needs something to measure, and FID real images. Built-in
        data has both (held-out scenes, the caption fidelity scorer)."""
        quality, held_out = self.quality, self.validation.val_fraction > 0
        if not quality.measures or self.data.builtin:
            return
        if not (quality.fid_weights or quality.clip_dir):
            raise ConfigError("--eval_every_n_steps has nothing to measure on this data",
                              "give --fid_weights PATH and/or --clip_dir PATH (the caption "
                              "fidelity scorer knows only the built-in shapes)")
        if quality.fid_weights and not held_out:
            raise ConfigError("--fid_weights compares the samples with held-out images",
                              "hold some data out, e.g. --val_fraction 0.05")


@dataclass(frozen=True)
class TrainVAEJob:
    """Everything `dalle-dist train-vae` reads."""

    vae: VAEConfig = field(default_factory=VAEConfig)
    schedule: VAESchedule = field(default_factory=VAESchedule)
    run: VAERun = field(default_factory=VAERun)
    train: TrainConfig = VAE_TRAIN_DEFAULTS
    data: DataConfig = field(default_factory=DataConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    samples: VAESamples = field(default_factory=VAESamples)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def validate(self) -> None:
        """As TrainJob.validate."""
        for section in (self.vae, self.schedule, self.train, self.resume, self.trackers,
                        self.samples, self.validation):
            section.validate()
