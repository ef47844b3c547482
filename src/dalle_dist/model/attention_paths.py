"""Ways to compute one pattern's attention over a whole sequence (no KV cache).

All take q, k, v as [batch, heads, n, dim_head] for positions 0..n-1 and return the
same shape; all must equal `dense_reference` (tests check outputs and gradients):

  dense_reference  einsum + masked softmax: the reference, and DALLE-pytorch's method
  sdpa             torch's scaled_dot_product_attention with the pattern's boolean mask
  axial_gather     rows (or columns) as batches: each image query scores text + its line
  conv_gather      each image query scores text + its k x k window, unfolded
  block_gather     each 16-token query block scores only the key blocks the layout allows
  flex             FlexAttention with a BlockMask from the pattern's rule (CUDA)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dalle_dist.model.patterns import (
    AttentionPattern,
    ConvLikePattern,
    SequenceLayout,
    SparsePattern,
)

AttentionPath = Callable[[Tensor, Tensor, Tensor, SequenceLayout, float], Tensor]


def softmax(scores: Tensor, stable: bool) -> Tensor:
    """DALLE-pytorch's stable softmax divides before subtracting the max (for fp16 runs)."""
    if stable:
        alpha = 32.0**2
        scores = scores / alpha
        scores = (scores - scores.amax(dim=-1, keepdim=True).detach()) * alpha
    return scores.softmax(dim=-1)


def dense_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout: float = 0.0,
                    stable: bool = False) -> Tensor:
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    attn = F.dropout(softmax(scores, stable), dropout)
    return torch.einsum("bhqk,bhkd->bhqd", attn, v)


def _text_part(q: Tensor, k: Tensor, v: Tensor, text: int, dropout: float) -> Tensor:
    """Text queries see earlier text in every pattern: plain causal attention."""
    return F.scaled_dot_product_attention(q[:, :, :text], k[:, :, :text], v[:, :, :text],
                                          is_causal=True, dropout_p=dropout)


def _image_grid(t: Tensor, layout: SequenceLayout) -> Tensor:
    """The image positions of [b, h, n, d] padded to the full grid: [b, h, s, s, d]."""
    s = layout.fmap_size
    image = t[:, :, layout.text_len:]
    image = F.pad(image, (0, 0, 0, s * s - image.shape[2]))
    return image.view(*t.shape[:2], s, s, t.shape[-1])


def axial_gather(q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout, dropout: float,
                 columns: bool = False) -> Tensor:
    """axial_row (or axial_col with columns=True): one SDPA batch per grid line."""
    n, text, s = q.shape[2], layout.text_len, layout.fmap_size
    out_text = _text_part(q, k, v, text, dropout)
    if n <= text:
        return out_text
    grids = [_image_grid(t, layout) for t in (q, k, v)]
    if columns:
        grids = [g.transpose(2, 3) for g in grids]
    qg, kg, vg = grids  # [b, h, line, place in line, d]
    b, h = q.shape[:2]
    kt = k[:, :, None, :text].expand(b, h, s, text, k.shape[-1])
    vt = v[:, :, None, :text].expand(b, h, s, text, v.shape[-1])
    keys, values = torch.cat((kt, kg), dim=3), torch.cat((vt, vg), dim=3)
    place = torch.arange(s, device=q.device)
    mask = torch.cat((torch.ones(s, text, dtype=torch.bool, device=q.device),
                      place[None, :] <= place[:, None]), dim=1)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, dropout_p=dropout)
    if columns:
        out = out.transpose(2, 3)
    out_image = out.reshape(b, h, s * s, -1)[:, :, : n - text]
    return torch.cat((out_text, out_image), dim=2)


def conv_window_positions(layout: SequenceLayout, pattern: ConvLikePattern,
                          device: torch.device) -> tuple[Tensor, Tensor]:
    """For every image cell, the positions of its k x k window's cells and whether each
    is on the grid: ([s*s, k*k] positions, [s*s, k*k] on-grid)."""
    s, kk, d, reach = layout.fmap_size, pattern.kernel_size, pattern.dilation, pattern.reach
    cells = torch.arange(s * s, device=device)
    offsets = torch.arange(kk, device=device) * d - reach
    rows = (cells // s)[:, None, None] + offsets[None, :, None]
    cols = (cells % s)[:, None, None] + offsets[None, None, :]
    on_grid = ((rows >= 0) & (rows < s) & (cols >= 0) & (cols < s)).flatten(1)
    positions = (layout.text_len + rows * s + cols).flatten(1)
    return positions, on_grid


def conv_gather(q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout, dropout: float,
                pattern: ConvLikePattern, stable: bool = False) -> Tensor:
    """conv_like: each image query scores all text plus its unfolded window."""
    n, text, s = q.shape[2], layout.text_len, layout.fmap_size
    out_text = _text_part(q, k, v, text, dropout)
    if n <= text:
        return out_text
    b, h, _, dh = q.shape
    kk, reach, m = pattern.kernel_size, pattern.reach, n - text

    def windows(t: Tensor) -> Tensor:  # [b, h, s*s, k*k, d]
        grid = _image_grid(t, layout).permute(0, 1, 4, 2, 3).reshape(b * h, dh, s, s)
        cols = F.unfold(grid, kk, dilation=pattern.dilation, padding=reach)
        return cols.view(b, h, dh, kk * kk, s * s).permute(0, 1, 4, 3, 2)[:, :, :m]

    kw, vw = windows(k), windows(v)
    positions, on_grid = conv_window_positions(layout, pattern, q.device)
    query_pos = torch.arange(text, n, device=q.device)
    valid = on_grid[:m] & pattern.allowed(layout, query_pos[:, None], positions[:m])
    qi = q[:, :, text:] / math.sqrt(dh)
    scores = torch.cat((qi @ k[:, :, :text].transpose(-1, -2),
                        torch.einsum("bhnd,bhnwd->bhnw", qi, kw)
                        .masked_fill(~valid, torch.finfo(q.dtype).min)), dim=-1)
    attn = F.dropout(softmax(scores, stable), dropout)
    out_image = (attn[..., :text] @ v[:, :, :text]
                 + torch.einsum("bhnw,bhnwd->bhnd", attn[..., text:], vw))
    return torch.cat((out_text, out_image), dim=2)


def block_index(pattern: SparsePattern, layout: SequenceLayout, n: int,
                device: torch.device) -> tuple[Tensor, Tensor]:
    """For each query block, the key blocks it may see (padded): ([nb, L] ids, [nb, L] used)."""
    nb = math.ceil(n / pattern.BLOCK)
    blocks = pattern.block_layout(layout, device)[:nb, :nb].tril()
    width = int(blocks.sum(dim=1).max())
    # Allowed blocks first (stable sort keeps their order), the rest as padding.
    order = torch.sort((~blocks).to(torch.int8), dim=1, stable=True).indices[:, :width]
    return order, blocks.gather(1, order)


def block_gather(q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout, dropout: float,
                 pattern: SparsePattern) -> Tensor:
    """sparse: each query block attends only its allowed key blocks, gathered."""
    b, h, n, dh = q.shape
    bs = pattern.BLOCK
    ids, used = block_index(pattern, layout, n, q.device)
    nb, width = ids.shape
    pad = nb * bs - n

    def blocked(t: Tensor) -> Tensor:
        return F.pad(t, (0, 0, 0, pad)).view(b, h, nb, bs, dh)

    qb, kb, vb = blocked(q), blocked(k), blocked(v)
    keys = kb[:, :, ids].reshape(b, h, nb, width * bs, dh)
    values = vb[:, :, ids].reshape(b, h, nb, width * bs, dh)
    q_pos = torch.arange(nb * bs, device=q.device).view(nb, bs)
    k_pos = (ids[:, :, None] * bs + torch.arange(bs, device=q.device)).view(nb, width * bs)
    k_used = used.repeat_interleave(bs, dim=1) & (k_pos < n)
    mask = k_used[:, None, :] & pattern.allowed(layout, q_pos[:, :, None], k_pos[:, None, :])
    # Padding queries past the end must see something (an all-masked row is NaN in
    # backward, even when sliced off): let them see themselves.
    mask = mask | ((q_pos[:, :, None] >= n) & (k_pos[:, None, :] == q_pos[:, :, None]))
    out = F.scaled_dot_product_attention(qb, keys, values, attn_mask=mask, dropout_p=dropout)
    return out.reshape(b, h, nb * bs, dh)[:, :, :n]


class FlexPath:
    """FlexAttention with a BlockMask built from the pattern's rule, compiled (CUDA)."""

    def __init__(self, pattern: AttentionPattern) -> None:
        self.pattern = pattern
        self._masks: dict[tuple[SequenceLayout, int, str], object] = {}
        self._kernel: Callable[..., Tensor] | None = None

    def block_mask(self, layout: SequenceLayout, n: int, device: torch.device) -> object:
        from torch.nn.attention.flex_attention import create_block_mask

        key = (layout, n, str(device))
        if key not in self._masks:
            pattern = self.pattern

            def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return pattern.allowed(layout, q_idx, kv_idx)

            self._masks[key] = create_block_mask(mask_mod, None, None, n, n, device=device)
        return self._masks[key]

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout,
                 dropout: float) -> Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        if self._kernel is None:
            self._kernel = torch.compile(flex_attention, dynamic=False)
        return self._kernel(q, k, v, block_mask=self.block_mask(layout, q.shape[2], q.device))
