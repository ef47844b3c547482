"""The models the selftest trains: their sizes per device, and the one untrained VAE every
process shares.

The VAE is untrained on purpose: token ids cost the same whatever the VAE learned, and
training one first (what `dalle-dist train` does on the built-in shapes without
--vae_path) would take minutes that prove nothing about the DALL-E's training. Every
process builds it from seed 0 on the CPU, so all runs see the same tokens; the resume
check hands it to `dalle-dist train --vae_path` as a checkpoint file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig

#: GPU: DALL-E dim 512, depth 8, 8 heads x 64, 64 text + 32 x 32 = 1024 image tokens.
#: CPU: dim 64, depth 2, 16 text + 8 x 8 = 64 image tokens.
MODELS = {
    "cuda": {"dim": 512, "depth": 8, "heads": 8, "dim_head": 64, "text_seq_len": 64,
             "image_size": 128, "num_layers": 2, "num_tokens": 1024},
    "cpu": {"dim": 64, "depth": 2, "heads": 2, "dim_head": 32, "text_seq_len": 16,
            "image_size": 32, "num_layers": 2, "num_tokens": 128},
}
#: The model dict's keys that are the DALL-E's `dalle-dist train` flags (the rest size
#: the VAE).
DALLE_FLAGS = ("dim", "depth", "heads", "dim_head", "text_seq_len")


def vae_config(model: dict[str, Any]) -> VAEConfig:
    return VAEConfig(image_size=model["image_size"], num_tokens=model["num_tokens"],
                     num_layers=model["num_layers"])


def model_configs(model: dict[str, Any]) -> tuple[DALLEConfig, VAEConfig]:
    """(DALLEConfig, VAEConfig) of a spec's model dict (the byte tokenizer's vocabulary,
    the default of `dalle-dist train`)."""
    from dalle_dist.data.tokenizer import ByteTokenizer

    vae = vae_config(model)
    dalle = DALLEConfig(num_text_tokens=ByteTokenizer().vocab_size,
                        text_seq_len=model["text_seq_len"], num_image_tokens=vae.num_tokens,
                        image_fmap_size=vae.fmap_size, dim=model["dim"], depth=model["depth"],
                        heads=model["heads"], dim_head=model["dim_head"],
                        attn_types=tuple(model.get("attn_types", ("full",))),
                        attn_dropout=model.get("dropout", 0.0),
                        ff_dropout=model.get("dropout", 0.0))
    return dalle, vae


def fresh_vae(vae_cfg: VAEConfig) -> DiscreteVAE:
    """The same untrained VAE in every process (built on the CPU from seed 0, without
    touching the caller's random streams)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return DiscreteVAE(vae_cfg)


def save_fresh_vae(model: dict[str, Any], path: Path) -> Path:
    """fresh_vae as a VAE checkpoint file, for `dalle-dist train --vae_path` (the format
    `dalle-dist train-vae` writes: docs/design.md, "Checkpoints")."""
    from dalle_dist.checkpoint.format import checkpoint_meta, write_checkpoint_file

    vae = fresh_vae(vae_config(model))
    write_checkpoint_file(path, checkpoint_meta(
        "vae", {"model": vae.config.to_dict()}, {"epoch": 0, "step": 0}, [], "single", 1,
        weights=vae.state_dict(), optimizer=None))
    return path
