"""Attention patterns and the attention layer that applies them.

A pattern is one mask definition (`allows`), the single source of truth for which earlier
positions a query may see. The layer asks the pattern for what to hand to torch's
`scaled_dot_product_attention`; patterns that are plain causal attention say so, which
lets SDPA use its causal kernel instead of a materialised mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dalle_dist.errors import ConfigError


@dataclass(frozen=True)
class SequenceLayout:
    """Where text and image tokens sit in the transformer's input.

    Positions 0..text_len-1 hold <bos> and the text; image token j (row-major over a
    fmap_size x fmap_size grid) sits at text_len + j. The last image token is only ever
    predicted, never fed, so a training sequence is one shorter than text + image.
    """

    text_len: int
    fmap_size: int

    @property
    def image_len(self) -> int:
        return self.fmap_size**2

    @property
    def seq_len(self) -> int:
        return self.text_len + self.image_len - 1


class AttentionPattern:
    """Which keys each query may attend to; subclasses define `allows`."""

    name: ClassVar[str]
    #: True when `allows` is exactly "key position <= query position".
    causal_only: ClassVar[bool] = False

    def allows(self, layout: SequenceLayout, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Boolean [len(q_pos), len(k_pos)]: may the query at q_pos[i] see k_pos[j]?"""
        raise NotImplementedError

    def sdpa_arguments(
        self, layout: SequenceLayout, q_start: int, q_len: int, k_len: int, device: torch.device
    ) -> tuple[Tensor | None, bool]:
        """(attn_mask, is_causal) for queries q_start.. over keys 0..k_len-1."""
        if self.causal_only:
            if q_start == 0 and q_len == k_len:
                return None, True
            if q_start + q_len == k_len and q_len == 1:
                return None, False  # the newest token sees everything before it
        q_pos = torch.arange(q_start, q_start + q_len, device=device)
        k_pos = torch.arange(k_len, device=device)
        return self.allows(layout, q_pos, k_pos), False


class FullPattern(AttentionPattern):
    """Causal attention over everything: text and all earlier image tokens."""

    name = "full"
    causal_only = True

    def allows(self, layout: SequenceLayout, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return k_pos[None, :] <= q_pos[:, None]


PATTERNS: dict[str, type[AttentionPattern]] = {cls.name: cls for cls in (FullPattern,)}


def build_pattern(name: str) -> AttentionPattern:
    """The pattern called `name`; an unknown name is a user error that lists the valid ones."""
    try:
        return PATTERNS[name]()
    except KeyError:
        known = ", ".join(sorted(PATTERNS))
        raise ConfigError(
            f"unknown attention pattern {name!r} in --attn_types", f"valid: {known}"
        ) from None


class LayerKVCache:
    """Preallocated keys and values of one layer, filled as sampling proceeds."""

    def __init__(self, batch: int, heads: int, max_len: int, dim_head: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (batch, heads, max_len, dim_head)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        end = self.length + k.shape[2]
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class Attention(nn.Module):
    """Multi-head self-attention through SDPA, masked by an AttentionPattern."""

    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float,
                 pattern: AttentionPattern) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        self.dropout = dropout
        self.pattern = pattern
        inner = heads * dim_head
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x: Tensor, layout: SequenceLayout,
                cache: LayerKVCache | None = None) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).view(b, n, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)
        q_start = 0
        if cache is not None:
            q_start = cache.length
            k, v = cache.append(k, v)
        mask, is_causal = self.pattern.sdpa_arguments(layout, q_start, n, k.shape[2], x.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
