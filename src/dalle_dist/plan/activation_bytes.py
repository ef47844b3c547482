"""What autograd saves in a training step, per layer and attention path, and what the VAE's
encode holds: the activation formulas of the plan.

Activations are counted per layer for the path `--attn_impl` takes on the device
(model/attention.py's resolve_impl, asked for each layer of the meta model); see
layer_activation_bytes. With --activation_checkpointing (--reversible) a layer keeps only
its input until backward, which recomputes one layer at a time (see `activations`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.errors import ConfigError
from dalle_dist.model.attention import resolve_impl
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.kernels import FLASH_CAPABILITY, MEMORY_EFFICIENT, sdpa_kernel
from dalle_dist.model.patterns import SequenceLayout, SparsePattern, build_pattern
from dalle_dist.plan.parameters import meta_dalle

SPARSE_BLOCK, SPARSE_LOCAL_BLOCKS = SparsePattern.BLOCK, SparsePattern.LOCAL_WINDOW_BLOCKS


def attention_path(pattern: str, device: str, fmap_size: int, attn_impl: str = "auto",
                   dropout: float = 0.0) -> str:
    """The path model/attention.py's resolve_impl takes for a training layer of `pattern`
    (it depends on the image grid's side, not on the text's length, and on whether the
    layer applies dropout: FlexAttention cannot)."""
    return resolve_impl(attn_impl, build_pattern(pattern), torch.device(device),
                        SequenceLayout(text_len=1, fmap_size=fmap_size), dropout)


def _band_keys(c: DALLEConfig, pattern: str) -> tuple[int, int]:
    """(lines gathered per grid line, keys per image query) of band_gather."""
    s, text = c.image_fmap_size, c.text_seq_len + 1
    band = (c.conv_kernel_size - 1) * c.conv_dilation + 1 if pattern == "conv_like" else 1
    return band, text + band * s


def _sparse_width(c: DALLEConfig, seq_len: int) -> tuple[int, int]:
    """(query blocks, an upper bound of key blocks per query block) of block_gather."""
    blocks = math.ceil(seq_len / SPARSE_BLOCK)
    random_blocks = (c.sparse_random_blocks if c.sparse_random_blocks is not None
                     else blocks // 4)
    text_blocks = math.ceil((c.text_seq_len + 1) / SPARSE_BLOCK)
    return blocks, min(blocks, text_blocks + SPARSE_LOCAL_BLOCKS + random_blocks)


@dataclass(frozen=True)
class Dtypes:
    """Bytes of the tensors a precision mode makes.

    residual: the residual stream and LayerNorm inputs; compute: matmul inputs and outputs;
    loss: logits' log-softmax (cross_entropy runs in fp32 under autocast).
    """

    residual: int
    compute: int
    loss: int
    autocast: bool

    @classmethod
    def of(cls, precision: str, whole_model: bool) -> Dtypes:
        kind = PRECISION_KINDS[precision]
        if kind.dtype is None:  # fp32: no autocast
            return cls(4, 4, 4, False)
        if whole_model:  # the backend casts the model (DeepSpeed): everything 16-bit
            return cls(kind.itemsize, kind.itemsize, kind.itemsize, False)
        return cls(4, kind.itemsize, 4, True)


def layer_activation_bytes(c: DALLEConfig, path: str, pattern: str, t: Dtypes,
                           device: str = "cuda") -> tuple[int, int]:
    """(bytes per sample, bytes per layer independent of the batch) autograd saves in one
    transformer block, as measured with saved-tensor hooks on CPU (n tokens, d = dim,
    i = heads x dim_head, f = ff_mult x dim, r / c = residual / compute bytes):

      attn_norm input x (r d), its output as the qkv input (c d), qkv (3 c i: q, k and v
      are views of it), the attention output, which is also to_out's input (c i: SDPA
      writes it token-major, so the transpose + reshape is a view), x after attention
      (r d), ff_norm output as the input of to_value and to_gate (c d; 2 c d under
      autocast, which casts it once per Linear), value, gate, gelu(gate) and their product
      (4 c f), two LayerNorms' mean and rstd (16), the fused kernel's logsumexp (4 x heads).
    --rotary_emb: the rotated q and k beside qkv's output (2 c i), and in a 16-bit compute
    dtype the rotation tables cast to it (2 x n x dim_head, per layer); measured
    on the sdpa and band gather paths (`dense`, the reference, saves less with it; so does
    sparse's gather, see _gather_bytes).
    --shift_tokens saves nothing more: the shifted input replaces the norm's output.
    An imported DALLE-pytorch model: rotate_values rotates q, k and v in one tensor, which
    then stands in for qkv's output (no 2 c i more); layer_scale keeps each branch's
    output for its scale's gradient (2 c d).
    Path extras: `sdpa` with a mask keeps the mask as an n x n float (per layer, not per
    sample); `flex` writes its output head-major (to_out copies it: + c i); `dense` keeps
    copies of q, k and v for its einsums instead of qkv's output, no logsumexp, and
    softmax(QK^T) (heads x n x n; on CUDA autocast runs it in fp32, then casts it);
    `gather`: see _gather_bytes.
    """
    n, d, h, dh = _seq_len(c), c.dim, c.heads, c.dim_head
    i, f = h * dh, c.dim * c.ff_mult
    r, k = t.residual, t.compute
    per_token = (r * d + k * d + 3 * k * i + k * i + r * d
                 + (2 if t.autocast else 1) * k * d + 4 * k * f + 16)
    per_sample, per_layer = per_token * n, 0
    if path == "sdpa":
        per_sample += 4 * h * n
        if pattern != "full":
            per_layer = n * n * k
    elif path == "flex":
        per_sample += (k * i + 4 * h) * n
    elif path == "dense":
        # Its q, k, v copies stand in for qkv's output; CUDA's autocast runs softmax in fp32.
        per_sample += h * n * n * (4 + k if t.autocast and device == "cuda" else k)
    elif path == "gather":
        extra, per_layer = _gather_bytes(c, pattern, k, device)
        per_sample += extra
    elif path == "matmul":
        extra, per_layer = _band_matmul_bytes(c, pattern, k)
        per_sample += extra
    else:
        raise ConfigError(f"unknown attention path {path!r}")
    if c.rotary_emb:
        # rotated values: the rotated q, k and v (3 c i) stand in for qkv's output; the
        # matmul path keeps neither (_band_matmul_bytes)
        if path != "matmul":
            per_sample += (0 if c.rotate_values else 2) * k * i * n
        if k != 4:
            per_layer += 2 * n * dh * k
    if c.layer_scale:  # each branch's output, kept for its scale's gradient
        per_sample += 2 * k * d * n
    return per_sample, per_layer


def _gather_bytes(c: DALLEConfig, pattern: str, k: int, device: str) -> tuple[int, int]:
    """(bytes per sample, bytes per layer) the `gather` path adds to the block's common
    tensors, k = compute bytes.

    Every call is 4-D, so SDPA runs a fused kernel: on CPU its flash kernel; on CUDA flash
    for an axial band in 16 bits (no mask), else the memory-efficient kernel (fp32, or
    conv_like's and sparse's boolean masks). Each saves its q, k, v and output (k bytes)
    and an fp32 logsumexp per query row (the memory-efficient kernel rounds a head's rows
    up to 32), never the probabilities; a mask it reads is converted to the compute dtype
    and saved once per layer (it broadcasts over the batch). The SDPA rules are
    model/kernels.py's sdpa_kernel, on an Ampere GPU.

    Band (axial_row, axial_col, conv_like; s = grid side, T = text + 1, K = T + band x s
    keys): the causal text part's output and logsumexp (its q, k and v are views of qkv);
    the grid's s x s queries and output, and each line's K keys and values (heads x s
    lines); conv_like's band mask (heads x s x s x K); an axial band's lower-right
    CausalBias is no tensor on CUDA, but CPU's kernel has no such variant and reads it
    materialised (s x K).
    sparse (B blocks of 16, W key blocks per query block, an upper bound): the query
    blocks and output, the W gathered key and value blocks per query block, the mask
    (B x 16 x W x 16) and the block ids index_select keeps (int64, B x W); the padded
    block copies replace qkv's output (and --rotary_emb's rotated q and k), which nothing
    saves then.
    CPU figures are without --attn_dropout, which sends CPU's SDPA to its math path.
    """
    h, dh = c.heads, c.dim_head
    dtype = torch.float32 if k == 4 else torch.bfloat16  # fp16 takes bf16's kernels there
    capability = FLASH_CAPABILITY if device == "cuda" else None

    def kernel(masked: bool) -> str:
        return sdpa_kernel(dtype, capability, dh, 0.0, masked)

    def lse(rows: int, masked: bool) -> int:  # a head's logsumexp bytes
        aligned = kernel(masked) == MEMORY_EFFICIENT
        return 4 * (math.ceil(rows / 32) * 32 if aligned else rows)

    if pattern == "sparse":
        blocks, width = _sparse_width(c, _seq_len(c))
        bs = SPARSE_BLOCK
        per_sample = h * blocks * (2 * k * bs * dh + 2 * k * width * bs * dh + lse(bs, True))
        rotated_qk = c.rotary_emb and not c.rotate_values
        per_sample -= (5 if rotated_qk else 3) * k * h * dh * _seq_len(c)
        return per_sample, blocks * bs * width * bs * k + 8 * blocks * width
    s, text = c.image_fmap_size, c.text_seq_len + 1
    _, keys = _band_keys(c, pattern)
    masked = pattern not in ("axial_row", "axial_col")
    per_sample = h * (k * text * dh + lse(text, False))
    per_sample += h * s * (2 * k * s * dh + 2 * k * keys * dh + lse(s, masked))
    if masked:
        per_layer = h * s * s * keys * k
    else:
        per_layer = s * keys * k if device == "cpu" else 0
    return per_sample, per_layer


def _band_matmul_bytes(c: DALLEConfig, pattern: str, k: int) -> tuple[int, int]:
    """(bytes per sample, bytes per layer) the `matmul` path (band_scores) adds to the
    block's common tensors, k = compute bytes; s = grid side, T = text + 1, K = T + band x s
    keys per image query.

    The path cuts q, k and v into copies (attention_paths.TextAndGrid), so qkv's output
    (3 x heads x dim_head a token, in the block's common tensors), or --rotary_emb's
    rotated q and k, is kept by nothing. It keeps instead: the causal text part's SDPA
    output and logsumexp, and its queries, keys and values (the matmuls read the same
    keys and values); the grid's padded queries, keys and values (s x s each: the band
    matmuls read them in place), or for conv_like its unfolded band of keys and of values
    (band x s x s each) instead of the grid's; the probabilities (s x s x K); axial_col's
    column-major matmul operands are copies of the queries and of the probabilities' text
    part. Per layer, the boolean rule (s x s x K, one byte each).
    """
    h, dh = c.heads, c.dim_head
    s, text = c.image_fmap_size, c.text_seq_len + 1
    band, keys = _band_keys(c, pattern)
    per_sample = -3 * k * h * dh * _seq_len(c)  # qkv's output, kept by nothing
    per_sample += h * (k * text * dh + 4 * text)  # the text part: output and logsumexp
    per_sample += h * k * text * dh  # the text's queries
    per_sample += h * k * s * s * dh  # the grid's queries
    per_sample += 2 * h * k * band * s * s * dh  # the band's keys and values
    per_sample += 2 * h * k * text * dh  # the text's keys and values
    per_sample += h * k * s * s * keys  # the probabilities
    if pattern == "axial_col":
        per_sample += h * k * s * s * (dh + text)
    return per_sample, s * s * keys


def _seq_len(c: DALLEConfig) -> int:
    return c.text_seq_len + 1 + c.image_fmap_size**2 - 1


def layer_paths(c: DALLEConfig, device: str, attn_impl: str) -> list[tuple[str, str]]:
    """(pattern, path) of every layer of the meta model (attn_types cycles over the depth)."""
    return [(p, attention_path(p, device, c.image_fmap_size, attn_impl, c.attn_dropout))
            for p in meta_dalle(c).layer_patterns]


@dataclass(frozen=True)
class Activations:
    """Bytes of one GPU's training step that scale with its batch, and those that don't."""

    per_sample: int  # saved activations + the widest backward moment, per sample
    fixed: int  # saved n x n masks (per masked layer, any batch)
    vae_per_sample: int  # the VAE phase, per image (vae_activation_bytes)
    masks_cached: int  # each masked layer's boolean mask (sparse gather's block mask), kept


def activations(c: DALLEConfig, v: VAEConfig, precision: str, device: str = "cuda",
                attn_impl: str = "auto", whole_model: bool = False,
                checkpointing: bool = False) -> Activations:
    """The activation model of one training step (see layer_activation_bytes for a layer).

    checkpointing (--activation_checkpointing): each layer keeps only its input (r d per
    token) from forward to backward, and backward recomputes one layer at a time, so the
    layers add depth x r d plus the largest single layer (its per-layer n x n mask too)
    instead of the sum of all.

    Around the layers: the embeddings' sum (the first layer's input, counted there), the
    final norm's input (r d) and stats (8), its output copied as the logits' input (c d),
    and the log-softmax of the logits, each position over its own vocabulary only (text
    positions over text + padding tokens, image positions over the codebook; Lt and Li
    elements), in fp32 under autocast.
    Backward then adds, at its widest: either the widest logits branch's two gradients (the
    log-softmax's and the logits', 2 x max(Lt, Li)), or, in the last layer's feed-forward,
    the gradients of value and gelu(gate) next to the product's (2 c f, the product itself
    already freed) and the residual stream's (r d), per token. The larger is taken.
    """
    t = Dtypes.of(precision, whole_model)
    n, d, f = _seq_len(c), c.dim, c.dim * c.ff_mult
    per_sample = fixed = masks = 0
    per_layer = []
    for pattern, path in layer_paths(c, device, attn_impl):
        s, layer = layer_activation_bytes(c, path, pattern, t, device)
        per_layer.append((s, layer))
        if path in ("sdpa", "dense") and pattern != "full":
            masks += n * n
        elif path == "gather" and pattern == "sparse":  # its BlockIndex's boolean mask
            blocks, width = _sparse_width(c, n)
            masks += blocks * SPARSE_BLOCK * width * SPARSE_BLOCK
    if checkpointing:
        per_sample = len(per_layer) * t.residual * d * n + max(s for s, _ in per_layer)
        fixed = max(layer for _, layer in per_layer)
    else:
        per_sample, fixed = sum(s for s, _ in per_layer), sum(x for _, x in per_layer)
    per_sample += (t.residual * d + 8 + t.compute * d) * n
    text_logits = c.text_seq_len * (c.num_text_tokens + c.text_seq_len)
    image_logits = c.image_fmap_size**2 * c.num_image_tokens
    per_sample += t.loss * (text_logits + image_logits)
    logits_backward = 2 * t.loss * max(text_logits, image_logits)
    last_layer = (2 * t.compute * f + t.residual * d) * n
    per_sample += max(logits_backward, last_layer)
    return Activations(per_sample, fixed, vae_activation_bytes(v, device), masks)


def vae_activation_bytes(v: VAEConfig, device: str = "cuda") -> int:
    """Per image, get_codebook_indices under no_grad (fp32), at its widest step.

    The image and its [-1, 1] copy stay referenced through the encoder (the copy is the
    call's argument). A conv holds its input and output, a ReLU its input and output, a
    ResBlock its input and two maps; on CPU each conv also makes a blocked-layout copy of
    the larger of its input and output (oneDNN's reorder). The int64 indices end it.
    """
    side, h = v.image_size, v.hidden_dim
    image = v.channels * side * side * 4
    reorder = 1 if device == "cpu" else 0
    widest, prev = 0, image  # beyond the image and its copy
    for layer in range(v.num_layers):
        side //= 2
        out = h * side * side * 4
        held_input = 0 if layer == 0 else prev  # the first conv reads the copy itself
        widest = max(widest, held_input + out + reorder * max(prev, out), 2 * out)
        prev = out
    if v.num_resnet_blocks:
        widest = max(widest, (3 + reorder) * prev)
    logits = v.num_tokens * side * side * 4
    widest = max(widest, prev + logits + reorder * max(prev, logits), logits + 8 * side**2)
    return 2 * image + widest
