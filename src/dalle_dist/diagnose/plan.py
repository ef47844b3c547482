"""`dalle-dist plan`: memory per GPU of a DALL-E training run, counted before anything launches.

Parameter shapes are the real model's, built on the meta device (no memory, no weights:
dalle_parameter_shapes); each backend's placement of the training state is the one it
declares (its plan_terms, backends/registry.py), each precision's element size its
PrecisionKind's. Everything else is arithmetic on those (the tests check it against what
autograd saves, and the whole estimate against the measured peak of CPU training steps:
bench/plan_check.py).

One row per backend x ZeRO stage x precision. Its peak is

    peak = static + max(vae, forward_backward, step)

static            resident parameters + optimizer states + persistent buffers
vae               the frozen VAE encoding the image batch (no grad), before the forward
forward_backward  the activations autograd saves for the whole model, at the start of
                  backward (the logits' gradients are the widest point), plus the head's
                  gradients, the gathered parameters of sharded engines and the 16-bit
                  weight copies autocast makes
step              every resident gradient, plus the optimizer's temporaries

The phases are affine in the per-GPU batch, so the largest batch that fits is exact under
the model. Byte counts per parameter (P = DALL-E parameters, N = GPUs):

  single, torch, horovod, fsdp (Adam, fused, fp32 states):
    fp32            params 4, grads 4, Adam exp_avg + exp_avg_sq 4 + 4
    bf16 / fp16     the same 4 + 4 + 8: autocast keeps the fp32 weights as the master copy
                    and fp32 gradients; it adds 2 bytes per Linear weight (the 16-bit
                    copies autograd saves for backward, alive forward to backward).
                    fp16's GradScaler adds only scalars.
    fsdp            params, grads and Adam / N; plus the root module (embeddings, final
                    norm, logits) unsharded from forward to the end of backward, and two
                    transformer blocks unsharded at a time (the running one, the prefetched
                    one), fp32 (no MixedPrecisionPolicy: autocast does the precision)
    torch (DDP)     + gradient buckets, a copy of all fp32 gradients (gradient_as_bucket_view
                    is off)
    horovod         + the 64 MiB fusion buffer (HOROVOD_FUSION_THRESHOLD's default)
  deepspeed (the whole model in the precision; no autocast):
    params p = 2 (bf16 / fp16) or 4 (fp32) bytes, grads p, optimizer:
    ZeRO 0, fp32    Adam 8 (torch's Adam runs as it is)
    ZeRO 0, 16-bit  fp32 master 4 + Adam 8 (FP16_UnfusedOptimizer), and at the step an fp32
                    copy of every gradient (4)
    ZeRO 1-3        fp32 master partition 4 + Adam 8, / N (ZeRO clones an fp32 partition
                    even in fp32); the step makes an fp32 copy of the local gradient
                    partition (4 / N) in 16-bit
    ZeRO 1          optimizer / N
    ZeRO 2          + gradients / N
    ZeRO 3          + parameters / N; a gathered unit (the largest submodule) plus the
                    prefetch bucket (5e7 elements) in p bytes, and parameters under 1e5
                    elements stay whole
    buffers         ZeRO 1-3 allocate the reduce bucket, 5e8 elements of p bytes
                    (contiguous_gradients); ZeRO 0 flattens up to 5e8 gradients to
                    all-reduce them at the step
  every backend     the frozen VAE's fp32 weights, whole on every GPU; each layer's cached
                    n x n boolean mask on masked paths; 512 MiB of CUDA context on cuda.

Activations are counted per layer for the path `--attn_impl` takes on the device
(model/attention.py's resolve_impl, asked for each layer of the meta model); see
layer_activation_bytes. With --activation_checkpointing (--reversible) a layer keeps only
its input until backward, which recomputes one layer at a time (see `activations`).

Parameters are the meta model's `parameters()`, so a module shared by several layers
(--shared_attn_ids / --shared_ff_ids) and the tied embeddings (--share_input_output_emb)
count once; FSDP's units are the ones train shards (Transformer.shard_groups: blocks that
share a module are one unit).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision import PRECISION_KINDS, PRECISIONS
from dalle_dist.backends.registry import BACKENDS
from dalle_dist.errors import ConfigError
from dalle_dist.model.attention import resolve_impl
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.dalle import DALLE
from dalle_dist.model.patterns import SequenceLayout, SparsePattern, build_pattern
from dalle_dist.model.rotary import rotated_features
from dalle_dist.model.vae import DiscreteVAE

DEVICES: tuple[str, ...] = ("cuda", "cpu")
#: Every backend's rows, (name, ZeRO stage), in order of cost (communication volume, then
#: set-up), as each declares its place (PlanTerms.cost_rank): the recommendation takes the
#: first that fits.
BACKEND_ORDER: tuple[tuple[str, int | None], ...] = tuple(
    (name, stage) for name, stage, _ in sorted(
        ((name, stage, rank) for name, cls in BACKENDS.items()
         for stage, rank in cls.plan_terms.rows()), key=lambda row: row[2]))
#: Of a GPU's memory, what a plan fills: the caching allocator's fragmentation and the
#: cuBLAS / cuDNN workspaces take the rest.
USABLE_FRACTION = 0.9
CUDA_CONTEXT_BYTES = 512 * 2**20
DS_REDUCE_BUCKET = 500_000_000  # elements: reduce_bucket_size / allgather_bucket_size
DS_PREFETCH_BUCKET = 50_000_000  # elements: stage3_prefetch_bucket_size
DS_PERSISTENCE_THRESHOLD = 100_000  # elements: stage3_param_persistence_threshold
SPARSE_BLOCK, SPARSE_LOCAL_BLOCKS = SparsePattern.BLOCK, SparsePattern.LOCAL_WINDOW_BLOCKS


def _terms(backend: str) -> PlanTerms:
    return BACKENDS[backend].plan_terms


# -- parameters ----------------------------------------------------------------------

@dataclass(frozen=True)
class MetaModel:
    """What the estimate reads of a model built on the meta device."""

    shapes: dict[str, tuple[int, ...]]  # every parameter, by name (a shared one once)
    linear_weights: int  # elements of every nn.Linear weight
    layer_patterns: tuple[str, ...] = ()  # each transformer layer's attention pattern
    units: tuple[int, ...] = ()  # elements of each FSDP unit of blocks (shard_groups)


@functools.lru_cache(maxsize=8)
def meta_dalle(c: DALLEConfig) -> MetaModel:
    """DALLE(c) built on the meta device (cached: a large model takes seconds to build)."""
    with torch.device("meta"):
        model = DALLE(c)
    units = tuple(sum(p.numel() for p in nn.ModuleList(group).parameters())
                  for group in model.transformer.shard_groups())
    return MetaModel({name: tuple(p.shape) for name, p in model.named_parameters()},
                     sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)),
                     tuple(block.attn.pattern.name for block in model.transformer.blocks),
                     units)


@functools.lru_cache(maxsize=8)
def meta_vae(v: VAEConfig) -> MetaModel:
    with torch.device("meta"):
        model = DiscreteVAE(v)
    return MetaModel({name: tuple(p.shape) for name, p in model.named_parameters()},
                     sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)))


def dalle_parameter_shapes(c: DALLEConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of DALLE(c), by name."""
    return dict(meta_dalle(c).shapes)


def vae_parameter_shapes(v: VAEConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of DiscreteVAE(v), by name."""
    return dict(meta_vae(v).shapes)


def numel(shapes: Iterable[tuple[int, ...]]) -> int:
    return sum(math.prod(s) for s in shapes)


def matmul_weights(c: DALLEConfig) -> int:
    """Elements of every Linear weight (blocks and logits): under autocast autograd keeps a
    16-bit copy of each from forward to its backward (biases are cast but not kept)."""
    return meta_dalle(c).linear_weights


def dalle_parameters(c: DALLEConfig) -> int:
    return numel(meta_dalle(c).shapes.values())


def vae_parameters(v: VAEConfig) -> int:
    return numel(meta_vae(v).shapes.values())


# -- attention paths -----------------------------------------------------------------

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
    band = c.conv_kernel_size // 2 * c.conv_dilation + 1 if pattern == "conv_like" else 1
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
    dtype the rotation tables cast to it (2 x n x rotated features, per layer); measured
    on the sdpa and gather paths (`dense`, the reference, saves less with it).
    --shift_tokens saves nothing more: the shifted input replaces the norm's output.
    Path extras: `sdpa` with a mask keeps the mask as an n x n float (per layer, not per
    sample); `flex` writes its output head-major (to_out copies it: + c i); `dense` keeps
    copies of q, k and v for its einsums instead of qkv's output, no logsumexp, and
    softmax(QK^T) (heads x n x n; on CUDA autocast runs it in fp32, then casts it);
    `gather` runs SDPA's math path, upcast to fp32, on each grid line: scaled q and k, v
    and the probabilities over the band's keys, plus the causal text part's output and
    logsumexp; for `sparse` the key blocks per query block are an upper bound.
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
    elif path == "gather" and pattern == "sparse":
        blocks, width = _sparse_width(c, n)
        bs, m = SPARSE_BLOCK, 4
        per_sample += m * h * blocks * bs * (dh + 2 * width * dh + width * bs)
        per_layer = blocks * bs * width * bs * m
    elif path == "gather":
        s, text = c.image_fmap_size, c.text_seq_len + 1
        _, keys = _band_keys(c, pattern)
        m = 4  # math SDPA upcasts 16-bit inputs to fp32
        per_sample += h * text * (k * dh + 4)
        per_sample += m * h * (s * s * dh + 2 * s * keys * dh + s * s * keys)
    else:
        raise ConfigError(f"unknown attention path {path!r}")
    if c.rotary_emb:
        per_sample += 2 * k * i * n
        if k != 4:
            per_layer += 2 * n * rotated_features(dh) * k
    return per_sample, per_layer


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
    masks_cached: int  # each masked layer's boolean mask, built once and kept


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


# -- rows ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One backend x ZeRO stage x precision, on one GPU of `gpus`.

    Byte columns are each component's own maximum; `peak` is the modelled high-water mark
    (not their sum: gradients fill as activations are freed). `items` names every term.
    """

    backend: str
    zero_stage: int | None
    precision: str
    gpus: int
    micro_batch: int
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    peak: int
    static: int
    phases: tuple[tuple[str, int, int], ...]  # (phase, bytes at any batch, bytes per sample)
    items: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        return _terms(self.backend).name_at(self.zero_stage)

    def peak_at(self, micro_batch: int) -> int:
        return self.static + max(c + k * micro_batch for _, c, k in self.phases)

    def max_micro_batch(self, budget: int) -> int:
        """The largest per-GPU batch whose peak fits in `budget` bytes (0: none)."""
        room = budget - self.static
        best: float = math.inf
        for _, const, per_sample in self.phases:
            if const > room:
                return 0
            if per_sample:
                best = min(best, (room - const) // per_sample)
        return int(best) if best != math.inf else 2**31

    def max_batch(self, budget: int) -> int:
        """The largest global batch (a multiple of the GPUs) that fits."""
        return self.max_micro_batch(budget) * self.gpus


def _deepspeed_states(stage: int, p_bytes: int, params: int, n: int) -> tuple[int, int, int]:
    """(params, grads, optimizer) resident bytes of one rank under ZeRO `stage`."""
    optimizer = 8 * params if stage == 0 and p_bytes == 4 else 12 * params
    return (p_bytes * params // (n if stage == 3 else 1),
            p_bytes * params // (n if stage >= 2 else 1),
            optimizer // (n if stage >= 1 else 1))


def estimate(config: DALLEConfig, batch: int, gpus: int, *, vae: VAEConfig | None = None,
             precisions: Sequence[str] = PRECISIONS, device: str = "cuda",
             attn_impl: str = "auto", activation_checkpointing: bool = False) -> list[Row]:
    """Memory per GPU of every backend x ZeRO stage x precision for a global `batch` split
    over `gpus` (the `single` row holds the whole batch on one GPU), with each block
    checkpointed under activation_checkpointing."""
    if vae is None:
        vae = VAEConfig(image_size=config.image_fmap_size * 4, num_tokens=config.num_image_tokens)
    check_plan(batch, gpus, precisions, device)
    rows = []
    for precision in precisions:
        for backend, stage in BACKEND_ORDER:
            n = 1 if _terms(backend).one_gpu else gpus
            rows.append(_row(config, vae, backend, stage, precision, n, batch // n, device,
                             attn_impl, activation_checkpointing))
    return rows


def check_plan(batch: int, gpus: int, precisions: Sequence[str], device: str) -> None:
    if gpus <= 0:
        raise ConfigError(f"--gpus must be positive, got {gpus}")
    if batch <= 0:
        raise ConfigError(f"--batch_size must be positive, got {batch}")
    if batch % gpus:
        lower = max(gpus, batch // gpus * gpus)
        raise ConfigError(f"--batch_size {batch} is the global batch and must be a multiple "
                          f"of the {gpus} GPUs", f"use --batch_size {lower} or {lower + gpus}")
    for precision in precisions:
        if precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {precision!r}", f"valid: {', '.join(PRECISIONS)}")
    if device not in DEVICES:
        raise ConfigError(f"unknown device {device!r}", f"valid: {', '.join(DEVICES)}")


@dataclass
class _States:
    """What one rank keeps of the model's training state, in bytes."""

    params: int
    grads: int
    optimizer: int
    buffers: dict[str, int]  # persistent: allocated once, kept through every step
    gathered: int = 0  # unsharded parameters (and gradients) of sharded engines, fwd + bwd
    step_temporaries: int = 0  # allocated by the optimizer step only


def _states(c: DALLEConfig, terms: PlanTerms, stage: int | None, p_bytes: int, n: int
            ) -> _States:
    shapes = dalle_parameter_shapes(c)
    params = numel(shapes.values())
    units = meta_dalle(c).units
    block = max(units)  # the largest unit of blocks (one block unless blocks share modules)
    if terms.sharding == "zero":
        stage = stage or 0
        p, g, opt = _deepspeed_states(stage, p_bytes, params, n)
        state = _States(p, g, opt, {})
        if stage >= 1:
            state.buffers["reduce_bucket"] = DS_REDUCE_BUCKET * p_bytes
            state.step_temporaries = 4 * params // n if p_bytes == 2 else 0
        elif p_bytes == 2:
            state.step_temporaries = 4 * params  # fp32 copies of the gradients at the step
        else:
            state.step_temporaries = min(params, DS_REDUCE_BUCKET) * p_bytes  # flattened
        if stage == 3:
            sizes = [math.prod(s) for s in shapes.values()]
            small = sum(x for x in sizes if x < DS_PERSISTENCE_THRESHOLD)
            state.params += small * p_bytes * (n - 1) // n
            state.gathered = (max(block, *sizes) + min(DS_PREFETCH_BUCKET, params)) * p_bytes
        return state
    if terms.sharding == "fully_shard":
        # The root unit (all but the blocks) stays gathered from forward to the end of
        # backward, with its unsharded gradients; two blocks are gathered at a time, and
        # one block's gradients wait for their reduce-scatter.
        root = params - sum(units)
        return _States(4 * params // n, 4 * params // n, 8 * params // n, {},
                       gathered=4 * (2 * root + 3 * block))
    buffers = {name: 4 * params for name in terms.gradient_copies} | dict(terms.fixed_buffers)
    return _States(4 * params, 4 * params, 8 * params, buffers)


def _row(c: DALLEConfig, v: VAEConfig, backend: str, stage: int | None, precision: str,
         n: int, micro: int, device: str, attn_impl: str, checkpointing: bool = False) -> Row:
    terms, kind = _terms(backend), PRECISION_KINDS[precision]
    p_bytes = kind.itemsize if terms.casts_model else 4
    state = _states(c, terms, stage, p_bytes, n)
    acts = activations(c, v, precision, device, attn_impl, whole_model=terms.casts_model,
                       checkpointing=checkpointing)
    shapes = dalle_parameter_shapes(c)
    head = numel((shapes["to_logits.weight"], shapes["to_logits.bias"]))
    autocast = kind.dtype is not None and not terms.casts_model
    autocast_copies = kind.itemsize * matmul_weights(c) if autocast else 0
    # fully_shard: the head's gradients are in `gathered`
    head_grads = 0 if terms.sharding == "fully_shard" else head * p_bytes
    resident = {"vae_params": 4 * vae_parameters(v), "attention_masks": acts.masks_cached,
                **state.buffers}
    if device == "cuda":
        resident["cuda_context"] = CUDA_CONTEXT_BYTES
    # On CPU the loader's image batch is the model's input and stays referenced all step.
    image = v.channels * v.image_size**2 * 4 if device == "cpu" else 0
    static = state.params + state.optimizer + sum(resident.values())
    phases = (
        ("vae", 0, acts.vae_per_sample),
        ("forward_backward", acts.fixed + head_grads + state.gathered + autocast_copies,
         acts.per_sample + image),
        ("step", state.grads + state.step_temporaries, image),
    )
    transient = {"gathered_params": state.gathered, "autocast_weight_copies": autocast_copies,
                 "step_temporaries": state.step_temporaries, "image_batch": image * micro}
    buffers = {**resident, **{k: x for k, x in transient.items() if x}}
    activation_bytes = acts.fixed + acts.per_sample * micro
    return Row(backend, stage, precision, n, micro, params=state.params, grads=state.grads,
               optimizer=state.optimizer, activations=activation_bytes,
               buffers=sum(buffers.values()),
               peak=static + max(const + per * micro for _, const, per in phases),
               static=static, phases=phases,
               items={"params": state.params, "grads": state.grads,
                      "optimizer": state.optimizer, "activations": activation_bytes,
                      "vae_activations": acts.vae_per_sample * micro, **buffers})


# -- recommendation ------------------------------------------------------------------

def recommend(rows: Sequence[Row], gpu_memory_bytes: int,
              usable_fraction: float = USABLE_FRACTION) -> str:
    """One sentence per precision (bf16 first): the cheapest backend that fits the batch,
    the largest batch it takes, and the backend that goes further."""
    budget = int(gpu_memory_bytes * usable_fraction)
    if not rows:
        return "nothing to recommend"
    gpus = max(r.gpus for r in rows)
    batch = next(r.micro_batch * r.gpus for r in rows)
    order = {key: i for i, key in enumerate(BACKEND_ORDER)}
    advice: dict[str, list[str]] = {}  # sentence -> the precisions it holds for
    # Smaller elements first; of equal size, the one without loss scaling (bf16 before fp16).
    for precision in sorted({r.precision for r in rows}, key=_advice_order):
        chain = sorted((r for r in rows if r.precision == precision and
                        (r.gpus == gpus or gpus == 1)),
                       key=lambda r: order[(r.backend, r.zero_stage)])
        advice.setdefault(_sentence(chain, batch, gpus, gpu_memory_bytes, budget), []).append(
            precision)
    return " ".join(f"{' / '.join(names)}: {text}" for text, names in advice.items())


def _advice_order(precision: str) -> tuple[int, bool]:
    kind = PRECISION_KINDS[precision]
    return kind.itemsize, kind.loss_scaled


def _sentence(chain: list[Row], batch: int, gpus: int, memory: int, budget: int) -> str:
    where = f"{gpus} x {format_bytes(memory, si=True)}"
    fits = [r for r in chain if r.max_batch(budget) >= batch]
    if not fits:
        best = max(chain, key=lambda r: r.max_batch(budget))
        largest = best.max_batch(budget)
        if largest == 0:
            least = min(chain, key=lambda r: r.peak_at(1))
            return (f"does not fit on {where} even with ZeRO-3 (the leanest, {least.label}, "
                    f"needs {format_bytes(least.peak_at(1))} per GPU at batch {least.gpus}).")
        return (f"batch {batch} does not fit on {where} even with ZeRO-3; the largest that "
                f"fits is {largest}, with {best.label}.")
    first = fits[0]
    top = first.max_batch(budget)
    text = f"fits with {first.label} up to batch {top}"
    if first is not chain[0]:
        text += f" ({chain[0].label}: up to {chain[0].max_batch(budget)})"
    further = [r for r in chain[chain.index(first) + 1:] if r.max_batch(budget) > top]
    if further:
        nxt = further[0]
        text += f"; {nxt.label} above that (up to {nxt.max_batch(budget)})"
        best = max(further, key=lambda r: r.max_batch(budget))
        if best.max_batch(budget) > nxt.max_batch(budget):
            text += f"; at most {best.max_batch(budget)}, with {best.label}"
    return text + "."


# -- units ---------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6,
          "MIB": 2**20, "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12,
          "TIB": 2**40}


def parse_memory(text: str) -> int:
    """"80GB", "40GiB", "24G", "16000MB" -> bytes. GB, MB and a bare G are decimal (a card
    sold as 80 GB holds at least 80e9 bytes); GiB and MiB binary. A unit is required."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS or unit in ("", "B"):
        raise ConfigError(f"--gpu_memory {text!r} is not a memory size",
                          "give a number and a unit, e.g. 80GB, 40GiB, 24G or 16000MB")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ConfigError(f"--gpu_memory must be positive, got {text!r}")
    return int(value)


def format_bytes(count: float, si: bool = False) -> str:
    """1.5 GiB, 300 MiB (binary), or 80 GB with si."""
    base, names = (1000, ("B", "KB", "MB", "GB", "TB")) if si else (
        1024, ("B", "KiB", "MiB", "GiB", "TiB"))
    value, unit = float(count), names[0]
    for unit in names:
        if abs(value) < base or unit == names[-1]:
            break
        value /= base
    return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.3g} {unit}"
