"""A Row per backend x ZeRO stage x precision: what one GPU holds of the training state,
the step's phases and their peak (`estimate`).

Byte counts per parameter (P = DALL-E parameters, N = GPUs):

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
    torch (DDP)     the same bytes, but the gradients are views into DDP's all-reduce
                    buckets (gradient_as_bucket_view): resident from the start, not made
                    by backward and freed by zero_grad
    horovod         + the 64 MiB fusion buffer (HOROVOD_FUSION_THRESHOLD's default)
  deepspeed (fp32 and bf16: the module fp32, bf16 through DeepSpeed's torch_autocast, as
  the others' autocast; fp16: the module cast by its fp16 section):
    params p = 2 (fp16) or 4 (fp32, bf16) bytes, grads p, optimizer:
    ZeRO 0, p = 4   Adam 8 (torch's Adam runs as it is)
    ZeRO 0, fp16    fp32 master 4 + Adam 8 (FP16_UnfusedOptimizer), and at the step an fp32
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision_kinds import PRECISION_KINDS, PRECISIONS
from dalle_dist.backends.registry import BACKENDS
from dalle_dist.errors import ConfigError
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.plan.activation_bytes import activations
from dalle_dist.plan.parameters import (
    dalle_parameter_shapes,
    matmul_weights,
    meta_dalle,
    numel,
    vae_parameters,
)

DEVICES: tuple[str, ...] = ("cuda", "cpu")
#: Every backend's rows, (name, ZeRO stage), in order of cost (communication volume, then
#: set-up), as each declares its place (PlanTerms.cost_rank): the recommendation takes the
#: first that fits.
BACKEND_ORDER: tuple[tuple[str, int | None], ...] = tuple(
    (name, stage) for name, stage, _ in sorted(
        ((name, stage, rank) for name, cls in BACKENDS.items()
         for stage, rank in cls.plan_terms.rows()), key=lambda row: row[2]))
CUDA_CONTEXT_BYTES = 512 * 2**20
DS_REDUCE_BUCKET = 500_000_000  # elements: reduce_bucket_size / allgather_bucket_size
DS_PREFETCH_BUCKET = 50_000_000  # elements: stage3_prefetch_bucket_size
DS_PERSISTENCE_THRESHOLD = 100_000  # elements: stage3_param_persistence_threshold


def _terms(backend: str) -> PlanTerms:
    return BACKENDS[backend].plan_terms


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
             attn_impl: str = "auto", activation_checkpointing: bool = False,
             token_shards: bool = False, ema: bool = False) -> list[Row]:
    """Memory per GPU of every backend x ZeRO stage x precision for a global `batch` split
    over `gpus` (the `single` row holds the whole batch on one GPU), with each block
    checkpointed under activation_checkpointing. token_shards: the batches are image
    token ids (train --token_shards), so no encode runs in the step; the image tokenizer's
    weights stay (the sample grids decode with it). ema: train --ema_decay's fp32 copy of
    the weights, 4 bytes per parameter divided as the parameters are (FSDP, ZeRO-3: over
    the GPUs; everywhere else whole on each). AdamW keeps Adam's two moments: the same
    optimizer bytes."""
    if vae is None:
        vae = VAEConfig(image_size=config.image_fmap_size * 4, num_tokens=config.num_image_tokens)
    check_plan(batch, gpus, precisions, device)
    rows = []
    for precision in precisions:
        for backend, stage in BACKEND_ORDER:
            n = 1 if _terms(backend).one_gpu else gpus
            rows.append(_row(config, vae, backend, stage, precision, n, batch // n, device,
                             attn_impl, activation_checkpointing, token_shards, ema))
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
    return _States(4 * params, 4 * params, 8 * params, dict(terms.fixed_buffers))


def _row(c: DALLEConfig, v: VAEConfig, backend: str, stage: int | None, precision: str,
         n: int, micro: int, device: str, attn_impl: str, checkpointing: bool = False,
         token_shards: bool = False, ema: bool = False) -> Row:
    terms, kind = _terms(backend), PRECISION_KINDS[precision]
    cast = precision in terms.casts_model
    p_bytes = kind.itemsize if cast else 4
    state = _states(c, terms, stage, p_bytes, n)
    acts = activations(c, v, precision, device, attn_impl, whole_model=cast,
                       checkpointing=checkpointing)
    shapes = dalle_parameter_shapes(c)
    head = numel((shapes["to_logits.weight"], shapes["to_logits.bias"]))
    autocast = kind.dtype is not None and not cast
    autocast_copies = kind.itemsize * matmul_weights(c) if autocast else 0
    # fully_shard: the head's gradients are in `gathered`
    head_grads = 0 if terms.sharding == "fully_shard" else head * p_bytes
    resident = {"vae_params": 4 * vae_parameters(v), "attention_masks": acts.masks_cached,
                **state.buffers}
    if device == "cuda":
        resident["cuda_context"] = CUDA_CONTEXT_BYTES
    if ema:
        sharded = terms.sharding == "fully_shard" or (terms.sharding == "zero" and stage == 3)
        params = numel(shapes.values())
        resident["ema"] = 4 * params // n if sharded else 4 * params
    # On CPU the loader's image batch is the model's input and stays referenced all step
    # (from token shards: the ids, widened to int64).
    image = 0 if device != "cpu" else (
        v.fmap_size**2 * 8 if token_shards else v.channels * v.image_size**2 * 4)
    encode = 0 if token_shards else acts.vae_per_sample
    # Gradients that live in buffers kept across steps are there from the start; the
    # others are made by backward and are all alive at the step.
    resident_grads = state.grads if terms.resident_grads else 0
    static = state.params + resident_grads + state.optimizer + sum(resident.values())
    phases = (
        ("vae", 0, encode),
        # head_grads: the logits' gradients, made early in backward while the activations
        # are alive (with resident gradients too: after zero_grad(set_to_none) backward
        # makes each afresh before DDP copies it into its bucket)
        ("forward_backward", acts.fixed + head_grads + state.gathered + autocast_copies,
         acts.per_sample + image),
        ("step", state.grads - resident_grads + state.step_temporaries, image),
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
                      "vae_activations": encode * micro, **buffers})
