"""The frozen image tokenizer a DALL-E trains on: our DiscreteVAE or a VQGAN.

Both offer the same interface (config.image_size / fmap_size / num_tokens / to_dict,
get_codebook_indices, decode, state_dict); a checkpoint's `configs["vae"]` says which
one it holds by its `tokenizer` key (absent: a DiscreteVAE, as every checkpoint written
before VQGANs were supported).
"""

from __future__ import annotations

from typing import Any

import torch

from dalle_dist.model.config import VAEConfig
from dalle_dist.model.vae import DiscreteVAE
from dalle_dist.model.vqgan import VQGAN, VQGAN_TOKENIZER, VQGANConfig

ImageTokenizer = DiscreteVAE | VQGAN


def is_vqgan_config(config: dict[str, Any]) -> bool:
    return config.get("tokenizer") == VQGAN_TOKENIZER


def image_tokenizer_from_dict(config: dict[str, Any]) -> ImageTokenizer:
    """The (untrained) model a checkpoint's VAE config dict describes."""
    if is_vqgan_config(config):
        return VQGAN(VQGANConfig.from_dict(config))
    return DiscreteVAE(VAEConfig.from_dict(config))


def content_hash(tokenizer: ImageTokenizer) -> str:
    """sha256 of the tokenizer's config and every weight's name, dtype, shape and bytes:
    token ids encoded by one tokenizer mean nothing to another, so token shards name the
    one that wrote them (data/token_shards.py) and training checks it."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(tokenizer.config.to_dict(), sort_keys=True).encode())
    for name, tensor in sorted(tokenizer.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {value.dtype} {tuple(value.shape)}".encode())
        digest.update(value.view(-1).view(torch.uint8).numpy().tobytes() if value.numel()
                      else b"")
    return digest.hexdigest()
