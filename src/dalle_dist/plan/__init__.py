"""`dalle-dist plan`: memory per GPU of a DALL-E training run, counted before anything launches.

Parameter shapes are the real model's, built on the meta device (no memory, no weights:
parameters.py); each backend's placement of the training state is the one it declares
(its plan_terms, backends/registry.py), each precision's element size its PrecisionKind's.
Everything else is arithmetic on those (the tests check it against what autograd saves,
and the whole estimate against the measured peak of CPU training steps:
tests/accuracy/plan_check.py).

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
the model.

parameters        the model's sizes, from DALLE and DiscreteVAE built on the meta device
activation_bytes  the formulas of what autograd saves, per layer and attention path, and
                  of the VAE's encode
rows              a Row per backend x ZeRO stage x precision: its training state per GPU
                  (the byte counts per parameter of every backend), phases and peak
advice            the recommendation: the cheapest backend that fits, per precision
units             memory sizes read (--gpu_memory) and printed
vqgan             a taming VQGAN as the image tokenizer, sized from its YAML

A package apart from `check` (this machine) and `doctor` (a failed log): it judges a run
that has not started, from the model and the backends' declared terms. It imports torch
(the meta device) but never an engine. The names below are the package's interface, for
`dalle-dist plan` and the tests.
"""

from __future__ import annotations

from dalle_dist.backends.precision_kinds import PRECISIONS
from dalle_dist.plan.activation_bytes import (
    SPARSE_BLOCK,
    SPARSE_LOCAL_BLOCKS,
    Activations,
    Dtypes,
    activations,
    attention_path,
    layer_activation_bytes,
    layer_paths,
    vae_activation_bytes,
)
from dalle_dist.plan.advice import USABLE_FRACTION, recommend
from dalle_dist.plan.parameters import (
    MetaModel,
    dalle_parameter_shapes,
    dalle_parameters,
    matmul_weights,
    meta_dalle,
    meta_vae,
    numel,
    vae_parameter_shapes,
    vae_parameters,
)
from dalle_dist.plan.rows import (
    BACKEND_ORDER,
    CUDA_CONTEXT_BYTES,
    DEVICES,
    DS_PERSISTENCE_THRESHOLD,
    DS_PREFETCH_BUCKET,
    DS_REDUCE_BUCKET,
    Row,
    check_plan,
    estimate,
)
from dalle_dist.plan.units import format_bytes, parse_memory

__all__ = [
    "BACKEND_ORDER", "CUDA_CONTEXT_BYTES", "DEVICES", "DS_PERSISTENCE_THRESHOLD",
    "DS_PREFETCH_BUCKET", "DS_REDUCE_BUCKET", "PRECISIONS", "SPARSE_BLOCK",
    "SPARSE_LOCAL_BLOCKS", "USABLE_FRACTION", "Activations", "Dtypes", "MetaModel", "Row",
    "activations", "attention_path", "check_plan", "dalle_parameter_shapes",
    "dalle_parameters", "estimate", "format_bytes", "layer_activation_bytes", "layer_paths",
    "matmul_weights", "meta_dalle", "meta_vae", "numel", "parse_memory", "recommend",
    "vae_activation_bytes", "vae_parameter_shapes", "vae_parameters",
]
