"""VQGAN (taming-transformers' VQModel) as a frozen image tokenizer: encoder, vector
quantizer, decoder.

Our own modules, written from the architecture of Esser et al. (taming/models/vqgan.py,
taming/modules/diffusionmodules/model.py, taming/modules/vqvae/quantize.py), with
parameter names that match VQModel's state_dict (`encoder.*`, `decoder.*`,
`quantize.embedding.weight`, `quant_conv.*`, `post_quant_conv.*`), so a taming checkpoint's
weights load as they are (checkpoint/taming.py reads the file). We never train it: it has
no loss, no discriminator and no dropout.

It offers what DALL-E and generate ask of our DiscreteVAE: `config.image_size`,
`config.fmap_size`, `config.num_tokens`, `config.to_dict()`, `get_codebook_indices` and
`decode`. Pixels are [0, 1] at its boundary, as everywhere in dalle_dist; taming's model
works in [-1, 1], so the conversion happens here and nowhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dalle_dist.config_base import DictConfig
from dalle_dist.errors import ConfigError

#: configs["vae"]["tokenizer"] of a DALL-E checkpoint whose image tokenizer is a VQGAN
VQGAN_TOKENIZER = "vqgan"

GROUPS = 32  # taming's Normalize: GroupNorm(32 groups, eps 1e-6)


@dataclass(frozen=True)
class VQGANConfig(DictConfig):
    """A VQModel's shape: the YAML's model.params (embed_dim, n_embed) and its ddconfig.

    source_sha256 names the checkpoint file the weights came from (provenance: a DALL-E
    checkpoint carries the weights themselves)."""

    embed_dim: int
    n_embed: int
    ch: int
    ch_mult: tuple[int, ...]
    num_res_blocks: int
    attn_resolutions: tuple[int, ...]
    resolution: int
    z_channels: int
    in_channels: int = 3
    out_ch: int = 3
    double_z: bool = False
    dropout: float = 0.0  # a training setting; a frozen tokenizer runs without dropout
    source_sha256: str = ""
    tokenizer: str = VQGAN_TOKENIZER  # tells this dict from a DiscreteVAE's in a checkpoint

    def __post_init__(self) -> None:
        # A checkpoint and a YAML hold lists; keep the dataclass hashable and comparable.
        object.__setattr__(self, "ch_mult", tuple(self.ch_mult))
        object.__setattr__(self, "attn_resolutions", tuple(self.attn_resolutions))

    @property
    def image_size(self) -> int:
        return self.resolution

    @property
    def num_tokens(self) -> int:
        return self.n_embed

    @property
    def channels(self) -> int:
        return self.out_ch

    @property
    def fmap_size(self) -> int:
        """Side of the token map: every level but the last halves the image."""
        return self.resolution // 2 ** (len(self.ch_mult) - 1)

    def validate(self, where: str = "the VQGAN config") -> None:
        """Shapes taming would build; ConfigError (one line) for any it would not."""
        for name in ("embed_dim", "n_embed", "ch", "resolution", "z_channels",
                     "in_channels", "out_ch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.num_res_blocks, int) or self.num_res_blocks < 0:
            raise ConfigError(f"{where}: num_res_blocks must be an integer >= 0, "
                              f"got {self.num_res_blocks!r}")
        if not self.ch_mult or not all(isinstance(m, int) and m > 0 for m in self.ch_mult):
            raise ConfigError(f"{where}: ch_mult must be a list of positive integers, "
                              f"got {list(self.ch_mult)}")
        if not all(isinstance(r, int) for r in self.attn_resolutions):
            raise ConfigError(f"{where}: attn_resolutions must be a list of integers")
        if any(self.ch * m % GROUPS for m in self.ch_mult):
            raise ConfigError(f"{where}: ch {self.ch} x ch_mult {list(self.ch_mult)} must "
                              f"be multiples of {GROUPS} (taming's GroupNorm has {GROUPS} "
                              "groups)")
        if self.double_z:
            raise ConfigError(f"{where}: double_z is true, which taming's VQModel cannot run "
                              "(its quant_conv takes z_channels)", "a VQGAN config has "
                              "double_z: false; check that this is a VQGAN's model.yaml")
        factor = 2 ** (len(self.ch_mult) - 1)
        if self.resolution % factor:
            raise ConfigError(f"{where}: resolution {self.resolution} is not divisible by "
                              f"{factor} (ch_mult has {len(self.ch_mult)} levels)")


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    """norm -> swish -> conv, twice, plus the input (through a 1x1 conv when the width
    changes: taming's `nin_shortcut`)."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.norm1 = _norm(in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = _norm(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        if in_ch != out_ch:
            self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        shortcut = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return shortcut + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels of a feature map, 1x1-conv projections."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, hgt, wid = x.shape
        h = self.norm(x)
        q, k, v = (proj(h).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # [b, hw, c], scale c^-1/2
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, hgt, wid))


class Downsample(nn.Module):
    """Stride-2 3x3 conv after padding right and bottom by one (taming's asymmetric pad)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution of the encoder or decoder: res blocks (in, out widths), each followed
    by attention where the resolution is in attn_resolutions, then the resampling, stored
    as taming names it (`downsample` / `upsample`; none at the last level)."""

    def __init__(self, channels: list[tuple[int, int]], attend: bool,
                 resample: Downsample | Upsample | None = None) -> None:
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(i, o) for i, o in channels)
        self.attn = nn.ModuleList(AttnBlock(o) for _, o in channels) if attend else (
            nn.ModuleList())
        self.resample_name = None
        if resample is not None:
            self.resample_name = type(resample).__name__.lower()
            self.add_module(self.resample_name, resample)

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        if self.resample_name is not None:
            h = getattr(self, self.resample_name)(h)
        return h


class Middle(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels)
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels, channels)

    def forward(self, h: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(h)))


class Encoder(nn.Module):
    """Image [-1, 1] -> z_channels (x2 with double_z) at 1 / 2^(levels-1) the size."""

    def __init__(self, c: VQGANConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(c.in_channels, c.ch, 3, padding=1)
        in_mult = (1, *c.ch_mult)
        res, levels = c.resolution, []
        for i, mult in enumerate(c.ch_mult):
            width, channels = c.ch * in_mult[i], []
            for _ in range(c.num_res_blocks):  # with none, the level keeps its width
                channels.append((width, c.ch * mult))
                width = c.ch * mult
            last = i == len(c.ch_mult) - 1
            levels.append(Level(channels, res in c.attn_resolutions,
                                None if last else Downsample(width)))
            res = res if last else res // 2
        self.down = nn.ModuleList(levels)
        self.mid = Middle(width)
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, c.z_channels * (2 if c.double_z else 1), 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(self.mid(h))))


class Decoder(nn.Module):
    """z_channels at the token map's size -> image [-1, 1] (unclamped)."""

    def __init__(self, c: VQGANConfig) -> None:
        super().__init__()
        width, res = c.ch * c.ch_mult[-1], c.fmap_size
        self.conv_in = nn.Conv2d(c.z_channels, width, 3, padding=1)
        self.mid = Middle(width)
        levels: list[Level] = []
        for i in reversed(range(len(c.ch_mult))):
            channels = []
            for _ in range(c.num_res_blocks + 1):
                channels.append((width, c.ch * c.ch_mult[i]))
                width = c.ch * c.ch_mult[i]
            levels.insert(0, Level(channels, res in c.attn_resolutions,
                                   None if i == 0 else Upsample(width)))
            res = res if i == 0 else res * 2
        self.up = nn.ModuleList(levels)  # index = level, as taming's state_dict names them
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, c.out_ch, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


@contextlib.contextmanager
def exact_fp32_matmuls() -> Iterator[None]:
    """fp32 matmuls at "highest" precision while inside (no TF32 on CUDA), the process's
    setting restored after. Through set_float32_matmul_precision, the spelling
    train.cuda_settings.set_tf32 uses: on torch >= 2.9 setting the new fp32_precision
    instead would make later reads of this one raise. Each matmul reads the setting when
    it is launched, so kernels queued before or after are unaffected."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


class VectorQuantizer(nn.Module):
    """Nearest codebook entry (squared L2) per position; the codebook is `embedding`."""

    def __init__(self, n_embed: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)

    def indices(self, z: Tensor) -> Tensor:
        """[b, d, h, w] -> [b, h*w] codebook ids, row-major. Distances in full fp32 even
        under autocast and under training's TF32 (exact_fp32_matmuls): neighbouring
        entries of a large codebook are closer than bf16, or TF32's 10-bit mantissa,
        resolves. (The meta device, on which `plan` sizes the encoder, has no autocast to
        turn off.)"""
        device = z.device.type
        with (torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device)
              else contextlib.nullcontext()), exact_fp32_matmuls():
            flat = z.float().flatten(2).transpose(1, 2)  # [b, hw, d]
            codebook = self.embedding.weight.float()
            distances = (flat.pow(2).sum(-1, keepdim=True) + codebook.pow(2).sum(-1)
                         - 2 * flat @ codebook.t())
            return distances.argmin(-1)


class VQGAN(nn.Module):
    """taming's VQModel without its loss: get_codebook_indices and decode, both in [0, 1]."""

    def __init__(self, config: VQGANConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config.n_embed, config.embed_dim)
        self.quant_conv = nn.Conv2d(config.z_channels, config.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)

    @torch.no_grad()
    def get_codebook_indices(self, images: Tensor) -> Tensor:
        """[b, C, H, W] in [0, 1] -> [b, fmap*fmap] token ids, row-major."""
        h = self.encoder(images * 2.0 - 1.0)
        return self.quantize.indices(self.quant_conv(h))

    def decode(self, indices: Tensor) -> Tensor:
        """[b, fmap*fmap] token ids -> [b, C, H, W] in [0, 1]."""
        side = self.config.fmap_size
        codes = self.quantize.embedding(indices).view(indices.shape[0], side, side, -1)
        out = self.decoder(self.post_quant_conv(codes.permute(0, 3, 1, 2)))
        return (out.clamp(-1.0, 1.0) + 1.0) * 0.5
