"""Models: the discrete VAE, the VQGAN, attention patterns, the transformer and DALLE.

Nothing here knows about data loading or distributed backends.
"""

from dalle_dist.model.attention import ATTN_IMPLS
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.dalle import DALLE
from dalle_dist.model.image_tokenizer import ImageTokenizer, image_tokenizer_from_dict
from dalle_dist.model.patterns import (
    PATTERNS,
    AttentionPattern,
    PatternOptions,
    SequenceLayout,
    build_pattern,
)
from dalle_dist.model.vae import DiscreteVAE
from dalle_dist.model.vqgan import VQGAN, VQGANConfig

__all__ = [
    "ATTN_IMPLS",
    "DALLE",
    "PATTERNS",
    "VQGAN",
    "AttentionPattern",
    "DALLEConfig",
    "DiscreteVAE",
    "ImageTokenizer",
    "PatternOptions",
    "SequenceLayout",
    "VAEConfig",
    "VQGANConfig",
    "build_pattern",
    "image_tokenizer_from_dict",
]
