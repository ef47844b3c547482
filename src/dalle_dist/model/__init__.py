"""Models: the discrete VAE, attention patterns, the transformer and DALLE.

Nothing here knows about data loading or distributed backends.
"""

from dalle_dist.model.attention import PATTERNS, AttentionPattern, SequenceLayout, build_pattern
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.dalle import DALLE
from dalle_dist.model.vae import DiscreteVAE

__all__ = [
    "DALLE",
    "PATTERNS",
    "AttentionPattern",
    "DALLEConfig",
    "DiscreteVAE",
    "SequenceLayout",
    "VAEConfig",
    "build_pattern",
]
