"""Models: the discrete VAE, attention patterns, the transformer and DALLE.

Nothing here knows about data loading or distributed backends.
"""

from dalle_dist.model.attention import ATTN_IMPLS
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.dalle import DALLE
from dalle_dist.model.patterns import (
    PATTERNS,
    AttentionPattern,
    PatternOptions,
    SequenceLayout,
    build_pattern,
)
from dalle_dist.model.vae import DiscreteVAE

__all__ = [
    "ATTN_IMPLS",
    "DALLE",
    "PATTERNS",
    "AttentionPattern",
    "DALLEConfig",
    "DiscreteVAE",
    "PatternOptions",
    "SequenceLayout",
    "VAEConfig",
    "build_pattern",
]
