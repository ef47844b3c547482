"""Typed model configurations. A checkpoint stores them as plain dicts (`asdict`)."""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.config_base import DictConfig
from dalle_dist.errors import ConfigError


@dataclass(frozen=True)
class VAEConfig(DictConfig):
    """Discrete VAE shape. Defaults suit the built-in 32x32 shapes on a CPU."""

    image_size: int = 32
    num_tokens: int = 128
    codebook_dim: int = 64
    num_layers: int = 2
    num_resnet_blocks: int = 1
    hidden_dim: int = 64
    channels: int = 3
    smooth_l1_loss: bool = False
    kl_loss_weight: float = 0.0
    straight_through: bool = False

    @property
    def fmap_size(self) -> int:
        """Side of the token map: each encoder layer halves the image."""
        return self.image_size // 2**self.num_layers

    def validate(self) -> None:
        for name in ("image_size", "num_tokens", "codebook_dim", "num_layers", "hidden_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.num_resnet_blocks < 0:
            raise ConfigError("--num_resnet_blocks must be >= 0")
        if self.kl_loss_weight < 0:
            raise ConfigError("--kl_loss_weight must be >= 0")
        factor = 2**self.num_layers
        if self.image_size % factor:
            lower = self.image_size // factor * factor
            examples = " or ".join(str(s) for s in (lower, lower + factor) if s > 0)
            raise ConfigError(
                f"--image_size {self.image_size} cannot be downsampled evenly by "
                f"--num_layers {self.num_layers} (factor {factor})",
                f"use an image size divisible by {factor}, e.g. {examples}",
            )


@dataclass(frozen=True)
class DALLEConfig(DictConfig):
    """Transformer over [<bos>, text tokens, image tokens].

    num_text_tokens is the tokenizer's vocabulary (id 0 = padding); the model adds
    text_seq_len more ids so each padding position gets its own token, as DALLE-pytorch does.
    """

    num_text_tokens: int
    text_seq_len: int
    num_image_tokens: int
    image_fmap_size: int
    dim: int = 256
    depth: int = 4
    heads: int = 4
    dim_head: int = 64
    ff_mult: int = 4
    attn_dropout: float = 0.0
    ff_dropout: float = 0.0
    attn_types: tuple[str, ...] = ("full",)
    loss_img_weight: float = 7.0
    conv_kernel_size: int = 5
    conv_dilation: int = 1
    sparse_random_blocks: int | None = None  # None: a quarter of the sequence's blocks
    sparse_seed: int = 0
    stable_softmax: bool = False

    def __post_init__(self) -> None:
        # A checkpoint stores attn_types as a list; keep the dataclass hashable and comparable.
        object.__setattr__(self, "attn_types", tuple(self.attn_types))

    @property
    def image_seq_len(self) -> int:
        return self.image_fmap_size**2

    def validate(self) -> None:
        for name in ("dim", "depth", "heads", "dim_head", "ff_mult", "text_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        for name in ("attn_dropout", "ff_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if self.loss_img_weight < 0:
            raise ConfigError("--loss_img_weight must be >= 0")
        if not self.attn_types:
            raise ConfigError("--attn_types is empty", "give at least one pattern, e.g. full")
