"""The attention layer: a pattern (patterns.py), a path to compute it (attention_paths.py)
and a KV cache for sampling.

The path is chosen per device and sequence, and can be overridden with --attn_impl.
"auto" takes the fastest correct one measured on the CPU machine (bench/attention.py;
forward + backward of one layer, 256 and 1024 image tokens):
  full               SDPA's causal kernel everywhere
  axial_row/col      the band gather on CPU (0.6x full's time at 1024 tokens, 0.9x at 256)
  conv_like          the band gather on CPU from 24 x 24 cells up (0.8x full at 1024);
                     below that SDPA with the mask (the gather's set-up costs more there)
  sparse             SDPA with the mask on CPU: the block gather copies its key blocks and
                     loses to it at every density measured
  on CUDA, every pattern but full goes to FlexAttention (block masks skip empty tiles),
                     except while training with --attn_dropout > 0: FlexAttention has no
                     dropout, so such layers take the CPU choice above (which applies it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dalle_dist.errors import ConfigError
from dalle_dist.model import attention_paths as paths
from dalle_dist.model.patterns import (
    AttentionPattern,
    AxialColPattern,
    AxialRowPattern,
    ConvLikePattern,
    SequenceLayout,
    SparsePattern,
)

ATTN_IMPLS: tuple[str, ...] = ("auto", "gather", "sdpa", "flex", "dense")


def has_gather_path(pattern: AttentionPattern) -> bool:
    return isinstance(pattern, (AxialRowPattern, AxialColPattern, ConvLikePattern,
                                SparsePattern))


#: conv_like's band gather beats the masked SDPA kernel on CPU from this grid side up.
CONV_GATHER_MIN_SIDE = 24


def resolve_impl(impl: str, pattern: AttentionPattern, device: torch.device,
                 layout: SequenceLayout | None = None, dropout: float = 0.0) -> str:
    """The path a layer with this pattern uses on this device for --attn_impl `impl`.

    `dropout` is the rate the layer applies now (0 in eval). FlexAttention cannot apply
    it, so `auto` leaves flex for the CPU choice (gather or masked SDPA, which both apply
    it inside SDPA) while a layer trains with dropout on, and an explicit `flex` then is a
    ConfigError: dropout is never silently dropped. Sampling (eval) keeps flex on CUDA.
    """
    if impl not in ATTN_IMPLS:
        raise ConfigError(f"unknown --attn_impl {impl!r}", f"valid: {', '.join(ATTN_IMPLS)}")
    if impl == "auto":
        if pattern.causal_only:
            return "sdpa"
        if device.type == "cuda" and not dropout:
            return "flex"
        if isinstance(pattern, SparsePattern):
            return "sdpa"
        if isinstance(pattern, ConvLikePattern):
            side = layout.fmap_size if layout is not None else 0
            return "gather" if side >= CONV_GATHER_MIN_SIDE else "sdpa"
        return "gather"
    if impl == "flex" and dropout:
        raise paths.flex_dropout_error()
    if impl == "gather" and not has_gather_path(pattern):
        return "sdpa"  # full attention has no sparsity to gather: its causal kernel is it
    return impl


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
    """Multi-head self-attention restricted by an AttentionPattern."""

    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float,
                 pattern: AttentionPattern, impl: str = "auto", stable: bool = False) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        self.dropout, self.stable = dropout, stable
        self.pattern = pattern
        self.impl = impl
        inner = heads * dim_head
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)
        self._masks: dict[tuple[SequenceLayout, str], Tensor] = {}

    def _mask(self, layout: SequenceLayout, device: torch.device) -> Tensor:
        """The pattern's mask over the longest sequence, built once per layout and device."""
        key = (layout, str(device))
        if key not in self._masks:
            self._masks[key] = self.pattern.full_mask(layout, layout.seq_len, device)
        return self._masks[key]

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout) -> Tensor:
        """Attention over positions 0..n-1 (no cache), along the chosen path."""
        dropout = self.dropout if self.training else 0.0
        n = q.shape[2]
        impl = resolve_impl(self.impl, self.pattern, q.device, layout, dropout)
        if impl == "dense":
            mask = self._mask(layout, q.device)[:n, :n]
            return paths.dense_reference(q, k, v, mask, dropout, self.stable)
        if impl == "sdpa":
            if self.pattern.causal_only:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
            mask = self._mask(layout, q.device)[:n, :n]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        if impl == "flex":
            return paths.flex(q, k, v, layout, dropout, self.pattern)
        pattern = self.pattern
        if isinstance(pattern, SparsePattern):
            return paths.block_gather(q, k, v, layout, dropout, pattern)
        rows_back = pattern.reach if isinstance(pattern, ConvLikePattern) else 0
        return paths.band_gather(q, k, v, layout, dropout, pattern, rows_back,
                                 columns=isinstance(pattern, AxialColPattern))

    def forward(self, x: Tensor, layout: SequenceLayout,
                cache: LayerKVCache | None = None) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).view(b, n, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)
        if cache is None:
            out = self._attend(q, k, v, layout)
        else:
            start = cache.length
            k, v = cache.append(k, v)
            if self.pattern.causal_only and n == 1:
                mask = None  # the newest token sees everything before it
            else:
                mask = self._mask(layout, x.device)[start:start + n, :start + n]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
