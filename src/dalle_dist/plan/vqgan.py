"""`plan` with a taming VQGAN as the image tokenizer (--taming, --vqgan_config_path).

The VQGAN is sized from its YAML alone (no weights read): our VQGAN module built on the
meta device from the ddconfig gives its parameters, and running its encoder there gives
the bytes one image's encode holds at its widest moment. Its terms take the places
plan/rows.py gives the DiscreteVAE's: frozen fp32 weights resident on every GPU
(`vae_params`), and the `vae` phase before the forward (`vae_activations`).

Encode bytes are counted as the VAE's are (activation_bytes.vae_activation_bytes, which
this reproduces exactly for a DiscreteVAE: tests/test_plan_vqgan.py): every tensor an op
allocates, alive until its last reference goes, under no_grad in fp32, plus the image
batch; on CPU each convolution also makes a blocked-layout copy of the larger of its input
and output (oneDNN's reorder). On the meta device SDPA takes its math path, so the
attention blocks' score matrices (hw x hw per attended level) are counted, which fused
kernels do not keep: an upper bound, small at the resolutions VQGANs attend at (16 x 16 in
taming's configs).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dalle_dist.errors import ConfigError
from dalle_dist.model.config import VAEConfig
from dalle_dist.model.vqgan import VQGAN, VQGANConfig
from dalle_dist.plan.parameters import vae_parameters
from dalle_dist.plan.rows import Row


def read_plan_vqgan(taming: bool, model_path: str | None, config_path: str | None
                    ) -> VQGANConfig | None:
    """The VQGAN the flags name (None: none named). Only its YAML is read; a checkpoint
    given beside it must exist, but its weights are never loaded."""
    from dalle_dist.checkpoint.taming import read_vqgan_config

    if not (taming or model_path or config_path):
        return None
    if not config_path:
        given = "--vqgan_model_path" if model_path else "--taming"
        raise ConfigError(f"{given} needs --vqgan_config_path: plan sizes the VQGAN from its "
                          "YAML", "give the VQGAN's model.yaml with --vqgan_config_path "
                          "(its weights are not needed)")
    if model_path and not Path(model_path).is_file():
        raise ConfigError(f"--vqgan_model_path {model_path} is not a file",
                          "give the VQGAN's last.ckpt, or drop the flag: plan needs only "
                          "--vqgan_config_path")
    return read_vqgan_config(config_path)


@functools.lru_cache(maxsize=8)
def vqgan_parameters(config: VQGANConfig) -> int:
    """Parameters of VQGAN(config) (encoder, decoder, codebook, 1x1 convs), from its shapes."""
    with torch.device("meta"):
        return sum(p.numel() for p in VQGAN(config).parameters())


class _LiveBytes(TorchDispatchMode):
    """Bytes of the tensors ops allocate, alive until their last reference goes, and the
    high-water mark. A returned tensor that aliases an input (a view, an in-place op)
    allocates nothing."""

    def __init__(self, conv_reorder: bool) -> None:
        super().__init__()
        self.conv_reorder = conv_reorder
        self.live = self.peak = 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, tuple | list) else (out,)
        for tensor, ret in zip(outs, func._schema.returns, strict=False):
            if isinstance(tensor, torch.Tensor) and ret.alias_info is None:
                nbytes = tensor.untyped_storage().nbytes()
                self.live += nbytes
                weakref.finalize(tensor, self._freed, nbytes)
        reorder = 0
        if self.conv_reorder and func is torch.ops.aten.convolution.default:
            reorder = max(args[0].untyped_storage().nbytes(), out.untyped_storage().nbytes())
        self.peak = max(self.peak, self.live + reorder)
        return out


def encode_bytes(model: torch.nn.Module, channels: int, side: int, device: str) -> int:
    """Per image, the widest moment of `model.get_codebook_indices` on one [1, channels,
    side, side] fp32 image (the image included), run on the meta device; `model` must be
    built there. device: cuda or cpu (cpu adds each convolution's reorder copy)."""
    with torch.device("meta"):
        image = torch.empty(1, channels, side, side)
    with _LiveBytes(conv_reorder=device == "cpu") as live:
        model.get_codebook_indices(image)
    return image.untyped_storage().nbytes() + live.peak


@functools.lru_cache(maxsize=8)
def vqgan_encode_bytes(config: VQGANConfig, device: str) -> int:
    """Per image, the bytes the VQGAN's encode (get_codebook_indices) holds at its widest."""
    with torch.device("meta"):
        model = VQGAN(config)
    return encode_bytes(model, config.in_channels, config.resolution, device)


def stand_in_vae(config: VQGANConfig) -> VAEConfig:
    """The VAEConfig plan.estimate is given for a VQGAN: the VQGAN's image (size, channels:
    the CPU rows keep the loader's batch) and tokens; its VAE terms are then replaced."""
    levels = max(1, len(config.ch_mult) - 1)
    return VAEConfig(image_size=config.resolution, num_tokens=config.n_embed,
                     num_layers=levels, channels=config.in_channels)


def with_vqgan(rows: Sequence[Row], config: VQGANConfig, stand_in: VAEConfig, device: str,
               encodes: bool = True) -> list[Row]:
    """The rows plan.estimate made with `stand_in`, with the VQGAN's frozen fp32 weights
    and encode bytes where the stand-in VAE's were (none when the step does not encode:
    token shards)."""
    weights = 4 * vqgan_parameters(config)
    delta = weights - 4 * vae_parameters(stand_in)
    per_image = vqgan_encode_bytes(config, device) if encodes else 0
    out = []
    for row in rows:
        phases = tuple((name, const, per_image if name == "vae" else per)
                       for name, const, per in row.phases)
        new = dataclasses.replace(
            row, static=row.static + delta, buffers=row.buffers + delta, phases=phases,
            items={**row.items, "vae_params": weights,
                   "vae_activations": per_image * row.micro_batch})
        out.append(dataclasses.replace(new, peak=new.peak_at(new.micro_batch)))
    return out
