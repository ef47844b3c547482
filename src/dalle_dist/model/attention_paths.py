"""Ways to compute one pattern's attention over a whole sequence (no KV cache).

All take q, k, v as [batch, heads, n, dim_head] for positions 0..n-1 and return the
same shape; all must equal `dense_reference` (tests check outputs and gradients):

  dense_reference  einsum + masked softmax: the reference, and DALLE-pytorch's method
  sdpa             torch's scaled_dot_product_attention with the pattern's boolean mask
  band_scores      the band patterns' scores as plain matmuls: each image query scores
                   the text and its band of lines, under one masked softmax (the
                   `matmul` impl; axial_row, axial_col, conv_like)
  band_gather      grid lines as heads: each image query scores the text plus its line
                   and the lines just before it (axial_row, axial_col, conv_like)
  block_gather     each 16-token query block scores only the key blocks the layout allows
  flex             FlexAttention with a BlockMask from the pattern's rule (CUDA); one
                   compiled kernel and one mask per (pattern, layout, device) for all
                   layers and lengths; no dropout (it refuses a non-zero rate, see
                   resolve_impl)

Every path but flex applies dropout to the attention probabilities (inside SDPA or after
the softmax), so a training layer with dropout on never takes flex.

Every SDPA call here is 4-D ([batch, heads, n, dim_head]): SDPA's fused kernels (flash,
memory-efficient, CPU flash) take nothing else, and send 5-D inputs to the math path.
Which kernel each pattern gets on a device: model/kernels.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dalle_dist.errors import ConfigError
from dalle_dist.model.patterns import (
    AttentionPattern,
    AxialColPattern,
    AxialRowPattern,
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


def band_gather(q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout, dropout: float,
                pattern: AttentionPattern, rows_back: int, columns: bool = False,
                causal: Tensor | None = None) -> Tensor:
    """axial_row (rows_back 0), axial_col (columns=True) and conv_like (rows_back = its
    reach): each grid line's queries attend the text plus that line and the `rows_back`
    lines before it.

    The lines ride in SDPA's head dimension ([b, heads x lines, place, d]): SDPA's fused
    kernels take 4-D inputs only (5-D goes to its math path, upcast to fp32). An axial
    line's rule is "all the text, and the line's cells up to the query's": causal aligned
    to the band's last key, which SDPA takes as a CausalBias with no mask (flash on CUDA
    in 16 bits). conv_like's rule masks the band down to the window: a boolean
    [lines, place, band keys] mask (memory-efficient kernel on CUDA), never n x n.
    `causal`: the axial band's CausalBias as the layer keeps it (Attention's cache,
    filled eagerly: torch.compile cannot build one inside a graph); None builds it."""
    n, text, s = q.shape[2], layout.text_len, layout.fmap_size
    out_text = _text_part(q, k, v, text, dropout)
    if n <= text:
        return out_text
    b, h, _, dh = q.shape
    band = rows_back + 1
    grids = [_image_grid(t, layout) for t in (q, k, v)]
    if columns:
        grids = [g.transpose(2, 3) for g in grids]
    qg, kg, vg = grids  # [b, h, line, place in line, d]

    def banded(g: Tensor, t: Tensor) -> Tensor:
        """[b, h x line, text + band * s, d]: the text, then lines line-rows_back .. line."""
        padded = F.pad(g, (0, 0, 0, 0, rows_back, 0))
        # One slice per line offset, not unfold: inductor (torch 2.13, 2+ CPU threads)
        # fused unfold's backward into a scatter-add that wrote past the gradient's end
        # once dropout sent SDPA to its math path (tests/model/test_compiled_paths.py).
        lines = [padded[:, :, i:i + s] for i in range(band)]
        keys = torch.cat((t[:, :, None, :text].expand(b, h, s, text, dh), *lines), dim=3)
        return keys.view(b, h * s, text + band * s, dh)

    keys, values = banded(kg, k), banded(vg, v)
    queries = qg.reshape(b, h * s, s, dh)
    if rows_back == 0 and isinstance(pattern, (AxialRowPattern, AxialColPattern)):
        # `causal`: the layer's lower_right_causal, fetched outside any traced call
        mask = causal if causal is not None else lower_right_causal(s, text + s)
    else:
        mask = band_mask(pattern, layout, n, rows_back, columns, q.device)
        mask = mask.expand(h, *mask.shape).reshape(1, h * s, s, text + band * s)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                         dropout_p=dropout).view(b, h, s, s, dh)
    if columns:
        out = out.transpose(2, 3)
    out_image = out.reshape(b, h, s * s, dh)[:, :, : n - text]
    return torch.cat((out_text, out_image), dim=2)


class TextAndGrid(torch.autograd.Function):
    """q, k and v [b, h, n, d] (any strides) cut into the text part, [b, h, text, d], and
    the image part padded with zeros to the whole grid, [b, h, cells, d], all six
    contiguous. Autograd's own slices would give each of the six gradients a zero-filled
    [b, h, n, d] tensor and then add each input's two: this backward writes each input's
    gradient once, into one new tensor."""

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, text: int,
                cells: int) -> tuple[Tensor, ...]:
        texts = tuple(t[:, :, :text].clone(memory_format=torch.contiguous_format)
                      for t in (q, k, v))
        grids = []
        for t in (q, k, v):
            b, h, n, d = t.shape
            grid = t.new_empty(b, h, cells, d)
            grid[:, :, :n - text].copy_(t[:, :, text:])
            grid[:, :, n - text:].zero_()
            grids.append(grid)
        return (*texts, *grids)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, _, _, text, _ = inputs
        ctx.text, ctx.shape = text, q.shape

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        # An output without a gradient arrives as zeros (materialize_grads, the default).
        text, (b, h, n, d) = ctx.text, ctx.shape
        out = []
        for g_text, g_grid in zip(grads[:3], grads[3:], strict=True):
            grad = g_text.new_empty(b, h, n, d)
            grad[:, :, :text].copy_(g_text)
            grad[:, :, text:].copy_(g_grid[:, :, :n - text])  # the padding's gradient drops
            out.append(grad)
        return (*out, None, None)


def band_scores(q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout, dropout: float,
                rows_back: int, hidden: Tensor, columns: bool = False,
                stable: bool = False) -> Tensor:
    """The band patterns (band_gather's) with the scores written out: each image query's
    scores against the text and against its band of lines, side by side, under one
    masked softmax, then multiplied back with the text's and the band's values.

    This is DALLE-pytorch's method (einsums and a masked softmax) without its copies: the
    text keys are read in place by one matmul for all the grid's queries, not copied
    beside every line's keys as band_gather's concatenation does, and an axial line's keys
    are the grid itself (conv_like's band of lines is one copy). On the CPU its matmuls
    beat SDPA's flash kernel at these key counts (a line's text + band keys are tens,
    not thousands: the kernel's blocking and its backward's recomputation cost more than
    the probabilities it avoids saving); bench/attention_paths.py measures it.
    `hidden`: the keys band_mask's [line, place, text + band keys] rule hides (its
    negation), built once per layout."""
    n, text, s = q.shape[2], layout.text_len, layout.fmap_size
    if n <= text:
        return _text_part(q, k, v, text, dropout)
    b, h, _, dh = q.shape
    band = rows_back + 1
    # The text parts, and the image positions padded to the whole grid, row-major
    # [b, h, s * s, d], all contiguous: a batched matmul copies a strided operand anyway
    # when the batch is over 1 (qkv's batch and head strides do not merge).
    q_text, k_text, v_text, q_img, k_img, v_img = TextAndGrid.apply(q, k, v, text, s * s)
    out_text = _text_part(q_text, k_text, v_text, text, dropout)
    # Scaled here: d values a query, not text + band x s scores.
    q_img = q_img.mul_(1 / math.sqrt(dh))

    def lines(t: Tensor) -> Tensor:  # [b, h, line, place, d]: rows, or columns
        g = t.view(b, h, s, s, dh)
        return g.transpose(2, 3) if columns else g

    def banded(t: Tensor) -> Tensor:  # [b, h, line, band x place, d]: lines line-rows_back..line
        if rows_back == 0:
            return lines(t)
        padded = F.pad(lines(t), (0, 0, 0, 0, rows_back, 0))
        # One slice per line offset (unfold's backward costs 1.7x these slices' on CPU).
        return torch.cat([padded[:, :, i:i + s] for i in range(band)], dim=3)

    to_text = torch.matmul(q_img, k_text.transpose(2, 3)).view(b, h, s, s, text)
    if columns:
        to_text = to_text.transpose(2, 3)
    to_band = torch.matmul(lines(q_img), banded(k_img).transpose(3, 4))
    scores = torch.cat((to_text, to_band), dim=4)
    scores = scores.masked_fill_(hidden, torch.finfo(scores.dtype).min)
    attn = F.dropout(softmax(scores, stable), dropout)
    attn_text, attn_band = attn.split((text, band * s), dim=4)
    if columns:
        attn_text = attn_text.transpose(2, 3)
    from_text = torch.matmul(attn_text.reshape(b, h, s * s, text), v_text)
    from_band = torch.matmul(attn_band, banded(v_img))  # [b, h, line, place, d]
    if columns:
        from_band = from_band.transpose(2, 3)
    out_image = (from_text + from_band.reshape(b, h, s * s, dh))[:, :, : n - text]
    return torch.cat((out_text, out_image), dim=2)


@functools.cache
def lower_right_causal(queries: int, keys: int) -> Tensor:
    """SDPA's CausalBias aligned to the last key, one object per shape (it holds no data).
    It cannot be constructed inside torch.compile, nor under a TorchDispatchMode (the FLOP
    count of `train --flops` runs the first forward under one), but either can use it: so
    it is built once, with the dispatch modes set aside."""
    # imported here: torch.nn.attention.bias imports dynamo, which `train --help` must not
    from torch.nn.attention.bias import causal_lower_right
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return causal_lower_right(queries, keys)


def band_mask(pattern: AttentionPattern, layout: SequenceLayout, n: int, rows_back: int,
              columns: bool, device: torch.device) -> Tensor:
    """Boolean [line, place, text + band keys]: the pattern's rule over each line's band
    (band_gather's key order; off-grid band rows are never seen)."""
    text, s = layout.text_len, layout.fmap_size
    band = rows_back + 1
    line = torch.arange(s, device=device)
    place = torch.arange(s, device=device)
    back = torch.arange(band, device=device) - rows_back
    key_line = line[:, None, None] + back[None, :, None]  # [line, band, 1]
    key_cell = ((key_line * s + place) if not columns else (place * s + key_line))
    key_pos = torch.where(key_line >= 0, text + key_cell, -1).reshape(s, band * s)
    key_pos = torch.cat((torch.arange(text, device=device).expand(s, text), key_pos), dim=1)
    query_cell = (line[:, None] * s + place) if not columns else (place * s + line[:, None])
    query_pos = text + query_cell  # [line, place]
    mask = (key_pos[:, None, :] >= 0) & pattern.allowed(layout, query_pos[:, :, None],
                                                        key_pos[:, None, :])
    # Grid padding past the sequence: let such queries see themselves (no all-masked rows).
    return mask | ((query_pos >= n)[:, :, None] & (key_pos[:, None, :] == query_pos[:, :, None]))


@dataclass(frozen=True)
class BlockIndex:
    """block_gather's plan for one sparse layout, over its longest sequence: `ids` [nb, W],
    the key blocks each query block reads (its allowed ones first, then block 0 as
    padding), and `mask` [nb, 1, 16, W x 16], the rule over those keys. A length-n
    sequence reads the first ceil(n / 16) rows: a real query only ever sees keys before
    it, so rows and keys past n matter only to padding queries, whose outputs are dropped
    (each sees at least itself: no all-masked row, which is NaN in backward)."""

    ids: Tensor
    mask: Tensor


def block_index(pattern: SparsePattern, layout: SequenceLayout,
                device: torch.device) -> BlockIndex:
    """The BlockIndex of `layout`, computed on the host and copied to `device` once: the
    width W is a shape, and reading it from a device tensor would wait on the device."""
    bs, n = pattern.BLOCK, layout.seq_len
    cpu = torch.device("cpu")
    nb = math.ceil(n / bs)
    blocks = pattern.block_layout(layout, cpu)[:nb, :nb].tril()
    width = int(blocks.sum(dim=1).max())
    # Allowed blocks first (stable sort keeps their order), the rest as padding.
    order = torch.sort((~blocks).to(torch.int8), dim=1, stable=True).indices[:, :width]
    used = blocks.gather(1, order)
    ids = torch.where(used, order, 0)
    q_pos = torch.arange(nb * bs).view(nb, bs)
    k_pos = (ids[:, :, None] * bs + torch.arange(bs)).view(nb, width * bs)
    mask = used.repeat_interleave(bs, dim=1)[:, None, :] & pattern.allowed(
        layout, q_pos[:, :, None], k_pos[:, None, :])
    mask = mask | ((q_pos[:, :, None] >= n) & (k_pos[:, None, :] == q_pos[:, :, None]))
    return BlockIndex(ids.to(device), mask[:, None].to(device))


class GatherRows(torch.autograd.Function):
    """`t.index_select(0, ids)` whose backward sums the repeated rows' gradients in fp32.

    Every query block gathers the first (text) block and padding repeats of block 0, so a
    block's key/value gradient is the sum of up to one gradient per query block. Autograd's
    own backward adds them with index_add_ in t's dtype: on CUDA one atomic add after
    another, each rounded to bf16, which put the sparse gather path's bf16 gradients 3.5x
    further from the fp32 reference than the dense path's (the GPU acceptance run,
    docs/gpu.md). Here they are added in fp32 and rounded once; fp32 inputs take the plain
    path."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, ids: Tensor) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.rows = t.shape[0]
        return t.index_select(0, ids)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (ids,) = ctx.saved_tensors
        total = grad.new_zeros((ctx.rows, *grad.shape[1:]), dtype=torch.float32)
        return total.index_add_(0, ids, grad.float()).to(grad.dtype), None


def gather_rows(t: Tensor, ids: Tensor) -> Tensor:
    """Rows `ids` of t; a half-precision t's gradient summed in fp32 (GatherRows)."""
    if t.dtype in (torch.float16, torch.bfloat16) and t.requires_grad:
        return GatherRows.apply(t, ids)
    return t.index_select(0, ids)


def block_gather(q: Tensor, k: Tensor, v: Tensor, dropout: float, pattern: SparsePattern,
                 index: BlockIndex) -> Tensor:
    """sparse: each query block attends only its allowed key blocks, gathered. Query
    blocks ride in SDPA's batch dimension and (batch, heads) in its head dimension, so
    the inputs are 4-D and the [blocks, 1, 16, keys] mask broadcasts over both; nothing
    here reads a device value (`index` is built once per layout: block_index)."""
    b, h, n, dh = q.shape
    bs = pattern.BLOCK
    nb = math.ceil(n / bs)
    ids, mask = index.ids[:nb], index.mask[:nb]
    width = ids.shape[1]
    pad = nb * bs - n

    def blocks(t: Tensor) -> Tensor:  # [nb, b, h, bs, d]
        t = F.pad(t, (0, 0, 0, pad)) if pad else t
        # Blocks first and contiguous: selecting blocks copies whole memory runs.
        return t.reshape(b, h, nb, bs, dh).permute(2, 0, 1, 3, 4).contiguous()

    qb, kb, vb = blocks(q), blocks(k), blocks(v)

    def gathered(t: Tensor) -> Tensor:  # [nb, b * h, width * bs, d]
        picked = gather_rows(t, ids.flatten()).view(nb, width, b, h, bs, dh)
        return picked.permute(0, 2, 3, 1, 4, 5).reshape(nb, b * h, width * bs, dh)

    out = F.scaled_dot_product_attention(qb.view(nb, b * h, bs, dh), gathered(kb),
                                         gathered(vb), attn_mask=mask, dropout_p=dropout)
    return out.view(nb, b, h, bs, dh).permute(1, 2, 0, 3, 4).reshape(b, h, nb * bs, dh)[:, :, :n]


def flex_dropout_error() -> ConfigError:
    """FlexAttention has no dropout: a dropped score is renormalised away by the softmax,
    not zeroed after it, so a score_mod cannot stand in for dropout on probabilities."""
    return ConfigError("--attn_impl flex cannot apply --attn_dropout: FlexAttention has no "
                       "dropout", "set --attn_dropout 0, or use --attn_impl auto, sdpa or gather")


#: The torch.compile backend of the shared kernel; FlexAttention needs inductor's
#: generated kernel to be fused (anything else runs its unfused reference).
FLEX_BACKEND = "inductor"
#: Graphs dynamo may keep for flex_attention while our kernel calls it (its default, 8,
#: is shared by every code object and is reached by 4 patterns x train/eval x 2 dtypes).
#: Past it dynamo runs flex unfused: correct, slow, and visible in flex_compile_stats.
FLEX_RECOMPILE_LIMIT = 64


def guarded_global_state(device_type: str) -> tuple[object, ...]:
    """The process-wide settings dynamo's global-state guard compares before reusing a
    graph (grad mode, autocast, determinism, matmul precision, default dtype, threads):
    a graph compiled outside autocast misses inside it, so a signature without them would
    recompile past the lifted limit (the GPU acceptance run's flex check, whose model runs
    under autocast after the attention check compiled the same shapes without it)."""
    matmul = torch.backends.cuda.matmul
    return (torch.is_grad_enabled(), torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type), torch.is_autocast_enabled("cpu"),
            torch.get_autocast_dtype("cpu"), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.get_float32_matmul_precision(),
            matmul.allow_bf16_reduced_precision_reduction,
            matmul.allow_fp16_reduced_precision_reduction, torch.get_default_dtype(),
            torch.get_num_threads())


class FlexKernel:
    """One compiled flex_attention, the mask_mods and the BlockMasks it reads, for every
    layer of the process.

    Dynamo keeps its compiled graphs on flex_attention's code object and guards them on the
    BlockMask's mask_mod and shapes. So layers share: one mask_mod function object per
    (pattern, layout, device) and one BlockMask per (pattern, layout, device), over the
    layout's whole sequence (a shorter one is padded to it); a pattern's graph compiles
    once for all the layers and all the lengths that use it, and compiles again only for
    a new pattern, layout, batch or head count, dtype, device or grad mode. `compiles`
    counts the graphs the backend was asked for (each recompile is one), for the GPU
    acceptance run.
    """

    def __init__(self, backend: str = FLEX_BACKEND) -> None:
        self.backend = backend
        self.compiles = 0
        self._compiled: Callable[..., Tensor] | None = None
        self._mask_mods: dict[tuple[object, ...], Callable[..., Tensor]] = {}
        self._block_masks: dict[tuple[object, ...], object] = {}
        self._signatures: set[tuple[object, ...]] = set()

    def mask_mod(self, pattern: AttentionPattern, layout: SequenceLayout,
                 device: torch.device) -> Callable[..., Tensor]:
        """The pattern's rule as FlexAttention's mask_mod, one object per (pattern, layout,
        device): a fresh closure per layer could cost a recompile per layer."""
        key = (pattern.key, layout, str(device))
        if key not in self._mask_mods:
            rule = pattern.bound_rule(layout, device)

            def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return rule(q_idx, kv_idx)

            self._mask_mods[key] = mask_mod
        return self._mask_mods[key]

    def block_mask(self, pattern: AttentionPattern, layout: SequenceLayout, n: int,
                   device: torch.device) -> object:
        """The BlockMask of a length-n sequence from position 0, built once."""
        from torch.nn.attention.flex_attention import create_block_mask

        key = (pattern.key, layout, n, str(device))
        if key not in self._block_masks:
            self._block_masks[key] = create_block_mask(
                self.mask_mod(pattern, layout, device), None, None, n, n, device=device)
        return self._block_masks[key]

    def compiled(self) -> Callable[..., Tensor]:
        """torch.compile(flex_attention), created on first use (importing this module
        compiles nothing) behind a backend that counts what it compiles."""
        if self._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            backend = torch._dynamo.lookup_backend(self.backend)

            def counting(graph: torch.fx.GraphModule, inputs: list[Tensor]) -> Callable:
                self.compiles += 1
                return backend(graph, inputs)

            # No fullgraph: past the recompile limit it would raise mid-run instead of
            # falling back to the unfused kernel.
            self._compiled = torch.compile(flex_attention, backend=counting, dynamic=False)
        return self._compiled

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout,
                 pattern: AttentionPattern) -> Tensor:
        """Attention of positions 0..n-1, computed over the layout's whole sequence.

        The kernel compiles for static shapes and strides, so each length would be a graph
        of its own. A shorter sequence (uncached sampling feeds every length) is padded to
        the whole one and its output cut back: every length shares one BlockMask and one
        graph. A real query sees only keys before it, never the padding; a padding query
        sees at least itself. Padding copies q, k and v into contiguous tensors, whose
        strides differ from the qkv projection's views, so outside autograd (sampling)
        every call is copied alike; a training step has the whole sequence and passes its
        views uncopied."""
        n = q.shape[2]
        full = max(n, layout.seq_len)
        copied = n < full or not torch.is_grad_enabled()
        if copied:
            q, k, v = (F.pad(t, (0, 0, 0, full - n)) if n < full else t.contiguous()
                       for t in (q, k, v))
        return self._attend(q, k, v, layout, pattern, copied)[:, :, :n]

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout,
                pattern: AttentionPattern, copied: bool) -> Tensor:
        block_mask = self.block_mask(pattern, layout, q.shape[2], q.device)
        if torch.compiler.is_compiling():
            # Traced inside a compiled model: flex becomes part of that graph.
            from torch.nn.attention.flex_attention import flex_attention

            return flex_attention(q, k, v, block_mask=block_mask)
        kernel = self.compiled()
        signature = (pattern.key, layout, tuple(q.shape), str(q.device), q.dtype,
                     torch.is_grad_enabled() and q.requires_grad, copied,
                     guarded_global_state(q.device.type))
        if signature in self._signatures:  # compiled already: no limit to lift (the
            return kernel(q, k, v, block_mask=block_mask)  # patch costs time every call)
        self._signatures.add(signature)
        with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
            return kernel(q, k, v, block_mask=block_mask)

    def stats(self) -> dict[str, int]:
        """compiles: graphs compiled; pairs: distinct (pattern, shape) pairs called with
        (shape: layout and q's shape, per device); signatures: those also told apart by
        dtype, grad mode and whether q, k and v were copied (each may compile once);
        block_masks: masks built; recompile_limit: the graphs dynamo keeps for flex, past
        which it runs flex unfused."""
        pairs = {s[:4] for s in self._signatures}
        return {"compiles": self.compiles, "pairs": len(pairs),
                "signatures": len(self._signatures), "block_masks": len(self._block_masks),
                "recompile_limit": FLEX_RECOMPILE_LIMIT}


@functools.cache
def flex_kernel() -> FlexKernel:
    """The process's one FlexKernel (created on first use): one compiled kernel and one
    mask cache shared by every layer of every model."""
    return FlexKernel()


def flex_compile_stats() -> dict[str, int]:
    """What the shared kernel compiled and for how many (pattern, shape) pairs (see
    FlexKernel.stats); the GPU acceptance run asserts compiles <= signatures."""
    return flex_kernel().stats()


def flex(q: Tensor, k: Tensor, v: Tensor, layout: SequenceLayout, dropout: float,
         pattern: AttentionPattern, kernel: FlexKernel | None = None) -> Tensor:
    """FlexAttention through the shared compiled kernel (or `kernel`). It cannot drop out
    attention probabilities, so it refuses dropout instead of ignoring it; resolve_impl
    never sends a layer here while dropout is on."""
    if dropout:
        raise flex_dropout_error()
    return (kernel or flex_kernel())(q, k, v, layout, pattern)
