"""Caption fidelity of a trained DALL-E on held-out built-in shapes captions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dalle_dist.data.scorer import fidelity
from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.data.tokenizer import Tokenizer, tokenize
from dalle_dist.model import DALLE, ImageTokenizer

#: Held-out captions come from a seed no training run uses by default.
HELD_OUT_SEED_OFFSET = 1_000_003


@dataclass
class FidelityResult:
    score: float
    images: torch.Tensor
    captions: list[str]

    @property
    def line(self) -> str:
        return f"caption fidelity: {self.score:.3f} over {len(self.captions)} images"


@torch.no_grad()
def evaluate_fidelity(model: DALLE, vae: ImageTokenizer, tokenizer: Tokenizer, count: int,
                      data_seed: int, device: torch.device, filter_thres: float = 0.9,
                      temperature: float = 1.0, batch_size: int = 64,
                      seed: int = 0, cond_scale: float = 1.0) -> FidelityResult:
    """Sample one image per held-out caption and score colour and shape; cond_scale:
    classifier-free guidance (1: none)."""
    captions = [ShapesDataset(count, vae.config.image_size, data_seed + HELD_OUT_SEED_OFFSET)
                .spec(i).caption for i in range(count)]
    text = tokenize(tokenizer, captions, model.config.text_seq_len, truncate=True).to(device)
    generator = torch.Generator(device).manual_seed(seed)
    images = torch.cat([
        model.generate_images(text[i:i + batch_size], vae, filter_thres, temperature, generator,
                              cond_scale=cond_scale)
        for i in range(0, count, batch_size)
    ]).cpu()
    # The scorer reads colour: a --transparent VAE's alpha is not part of it.
    return FidelityResult(fidelity(images[:, :3], captions), images, captions)
