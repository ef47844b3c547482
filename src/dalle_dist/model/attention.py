"""The attention layer: a pattern (patterns.py), a path to compute it (attention_paths.py)
and a KV cache for sampling.

The path is chosen per device and sequence, and can be overridden with --attn_impl.
"auto" takes the fastest correct one as bench/attention.py and bench/attention_paths.py
measured it on the CPU machine (forward + backward of one layer; the figures:
docs/benchmarks.md, "Attention"):
  full               SDPA's causal kernel everywhere
  axial_row/col      on CPU the band's scores as plain matmuls (`matmul`: each query
                     scores the text and its grid line, one masked softmax) from 12 x 12
                     cells up; below that SDPA with the mask
  conv_like          on CPU `matmul` from 16 x 16 cells up (its band: the window's lines);
                     below that SDPA with the mask (the band's set-up costs more there)
  sparse             SDPA with the mask on CPU: the block gather copies its key blocks and
                     loses to it at every density measured
  on CUDA, every pattern but full goes to FlexAttention (block masks skip empty tiles),
                     except while training with --attn_dropout > 0: FlexAttention has no
                     dropout, so such layers take a path that applies it, fused: the axial
                     gather on flash (16-bit), conv_like's on the memory-efficient kernel
                     from 24 x 24 cells (below, and for sparse, that kernel with the n x n
                     mask as a bias: their gathers would copy several times K and V;
                     docs/design.md, "Attention patterns").
The kernel each pattern reaches: model/kernels.py (what `plan` and `check` print).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from dalle_dist.model.rotary import Rotation, apply_rotary

if TYPE_CHECKING:
    from dalle_dist.model.shift import ShiftRows

ATTN_IMPLS: tuple[str, ...] = ("auto", "matmul", "gather", "sdpa", "flex", "dense")


def has_gather_path(pattern: AttentionPattern) -> bool:
    return isinstance(pattern, (AxialRowPattern, AxialColPattern, ConvLikePattern,
                                SparsePattern))


def has_band(pattern: AttentionPattern) -> bool:
    """Patterns whose image queries see only a band of grid lines (and the text): the
    `matmul` path's, and band_gather's."""
    return isinstance(pattern, (AxialRowPattern, AxialColPattern, ConvLikePattern))


#: On CUDA with dropout, conv_like's band gather beats the masked SDPA kernel from this
#: grid side up.
CONV_GATHER_MIN_SIDE = 24
#: On CPU, the `matmul` path beats SDPA with the n x n mask from these grid sides up
#: (bench/attention_paths.py): an axial band from 12 x 12, conv_like's wider one from 16 x 16.
AXIAL_MATMUL_MIN_SIDE = 12
CONV_MATMUL_MIN_SIDE = 16


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
        side = layout.fmap_size if layout is not None else 0
        conv = isinstance(pattern, ConvLikePattern)
        if device.type == "cuda":  # with dropout: a fused kernel that applies it
            return "gather" if not conv or side >= CONV_GATHER_MIN_SIDE else "sdpa"
        min_side = CONV_MATMUL_MIN_SIDE if conv else AXIAL_MATMUL_MIN_SIDE
        return "matmul" if side >= min_side else "sdpa"
    if impl == "flex" and dropout:
        raise paths.flex_dropout_error()
    if impl == "gather" and not has_gather_path(pattern):
        return "sdpa"  # full attention has no sparsity to gather: its causal kernel is it
    if impl == "matmul" and not has_band(pattern):
        return resolve_impl("auto", pattern, device, layout, dropout)  # full, sparse
    return impl


class LayerKVCache(nn.Module):
    """Keys and values of one layer for sampling, preallocated for the whole sequence.

    Written in place at a position tensor and read whole, so every decode step sees the
    same shapes ([batch, heads, max_len, dim_head]) and the step can be compiled or captured
    in a CUDA graph; `mask` holds the layer's pattern over that length, and its row for a
    query hides both the pattern's exclusions and the positions not written yet. The
    buffers are zeros, not garbage: a masked key gets weight 0, and 0 x NaN would still be
    NaN. Buffers (not plain attributes) so torch.compile treats them as static addresses.
    """

    def __init__(self, batch: int, heads: int, mask: Tensor, dim_head: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        shape = (batch, heads, mask.shape[1], dim_head)
        self.register_buffer("k", torch.zeros(shape, device=mask.device, dtype=dtype),
                             persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=mask.device, dtype=dtype),
                             persistent=False)
        self.register_buffer("mask", mask, persistent=False)
        #: --shift_tokens: the block's last grid row (shift.ShiftRows), set by the Transformer.
        self.shift: ShiftRows | None = None

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write(self, k: Tensor, v: Tensor, positions: Tensor) -> None:
        """Store [batch, heads, n, dim_head] keys and values at the n given positions
        (cast to the cache's dtype: under autocast or FSDP's mixed precision they may
        come in a lower one; a cast to the same dtype is free)."""
        self.k.index_copy_(2, positions, k.to(self.k.dtype))
        self.v.index_copy_(2, positions, v.to(self.v.dtype))

    def attend(self, q: Tensor, positions: Tensor) -> Tensor:
        """Queries at `positions` over the whole cache, masked by the pattern's rows."""
        mask = self.mask.index_select(0, positions)
        out = F.scaled_dot_product_attention(q.to(self.k.dtype), self.k, self.v, attn_mask=mask)
        return out.to(q.dtype)


class Attention(nn.Module):
    """Multi-head self-attention restricted by an AttentionPattern."""

    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float,
                 pattern: AttentionPattern, impl: str = "auto", stable: bool = False,
                 rotate_values: bool = False) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        self.dropout, self.stable = dropout, stable
        #: DALLE-pytorch 1.x rotates the values too (DALLEConfig.rotate_values)
        self.rotate_values = rotate_values
        self.pattern = pattern
        self.impl = impl
        inner = heads * dim_head
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)
        self._masks: dict[tuple[SequenceLayout, str], Tensor] = {}
        self._block_indices: dict[tuple[SequenceLayout, str], paths.BlockIndex] = {}
        self._band_masks: dict[tuple[SequenceLayout, str], Tensor] = {}
        self._causal_biases: dict[SequenceLayout, Tensor] = {}

    def _mask(self, layout: SequenceLayout, device: torch.device) -> Tensor:
        """The pattern's mask over the longest sequence, built once per layout and device."""
        key = (layout, str(device))
        if key not in self._masks:
            self._masks[key] = self.pattern.full_mask(layout, layout.seq_len, device)
        return self._masks[key]

    def _block_index(self, pattern: SparsePattern, layout: SequenceLayout,
                     device: torch.device) -> paths.BlockIndex:
        """block_gather's key blocks and mask over the longest sequence, built once per
        layout and device (on the host: a forward then reads no device value)."""
        key = (layout, str(device))
        if key not in self._block_indices:
            self._block_indices[key] = paths.block_index(pattern, layout, device)
        return self._block_indices[key]

    def _band_hidden(self, layout: SequenceLayout, device: torch.device) -> Tensor:
        """The keys the `matmul` path hides: the negation of band_mask's [line, place,
        text + band keys] rule, built once per layout and device. Built for the longest
        sequence, it serves every length: an image query always sees the text, so no row
        is all hidden, and a real query sees only keys before it, never grid padding."""
        key = (layout, str(device))
        if key not in self._band_masks:
            self._band_masks[key] = ~paths.band_mask(
                self.pattern, layout, layout.seq_len, self._rows_back(),
                isinstance(self.pattern, AxialColPattern), device)
        return self._band_masks[key]

    def _lower_right(self, layout: SequenceLayout) -> Tensor:
        """The axial band gather's lower-right CausalBias (it holds no data, only shapes),
        kept per layout: train --compile's block graphs read it here, since dynamo can
        neither build one nor call the cached builder inside a graph (the block's eager
        warm-up call fills this cache first)."""
        if layout not in self._causal_biases:
            s = layout.fmap_size
            self._causal_biases[layout] = paths.lower_right_causal(s, layout.text_len + s)
        return self._causal_biases[layout]

    def _rows_back(self) -> int:
        """Grid lines before a query's own that its band holds (conv_like's reach)."""
        return self.pattern.reach if isinstance(self.pattern, ConvLikePattern) else 0

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
        columns = isinstance(pattern, AxialColPattern)
        if impl == "matmul":
            return paths.band_scores(q, k, v, layout, dropout, self._rows_back(),
                                     self._band_hidden(layout, q.device), columns, self.stable)
        if isinstance(pattern, SparsePattern):
            return paths.block_gather(q, k, v, dropout, pattern,
                                      self._block_index(pattern, layout, q.device))
        axial = isinstance(pattern, (AxialRowPattern, AxialColPattern))
        return paths.band_gather(q, k, v, layout, dropout, pattern, self._rows_back(),
                                 columns, self._lower_right(layout) if axial else None)

    def new_cache(self, batch: int, layout: SequenceLayout, device: torch.device,
                  dtype: torch.dtype) -> LayerKVCache:
        """An empty cache for sampling `batch` sequences of `layout` with this layer."""
        return LayerKVCache(batch, self.heads, self._mask(layout, device), self.dim_head, dtype)

    def forward(self, x: Tensor, layout: SequenceLayout, cache: LayerKVCache | None = None,
                positions: Tensor | None = None, rotation: Rotation | None = None) -> Tensor:
        """x holds positions 0..n-1 without a cache; with one, the given `positions` [n]
        (a tensor, so a compiled decode step does not specialise on the step number).
        `rotation` (--rotary_emb) is that of x's positions: queries and keys are rotated
        before any path or the cache sees them."""
        b, n, _ = x.shape
        qkv = self.to_qkv(x).view(b, n, 3, self.heads, self.dim_head)
        if rotation is not None:
            # q and k rotated together, token-major ([b, n, 2, heads, dh], the tables
            # broadcast over both and the heads): SDPA then writes its output token-major
            # too, and to_out's reshape stays a view. Cast once per layer: the fp32
            # tables, in q's dtype.
            cos, sin = (t.to(qkv.dtype)[:, None, None] for t in rotation)
            if self.rotate_values:
                q, k, v = apply_rotary(qkv, (cos, sin)).permute(2, 0, 3, 1, 4)
            else:
                q, k = apply_rotary(qkv[:, :, :2], (cos, sin)).permute(2, 0, 3, 1, 4)
                v = qkv[:, :, 2].transpose(1, 2)
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if cache is None:
            out = self._attend(q, k, v, layout)
        else:
            if positions is None:
                raise ValueError("a KV cache needs the positions of the tokens it is given")
            cache.write(k, v, positions)
            out = cache.attend(q, positions)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
