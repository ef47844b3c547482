"""The model's sizes, read from DALLE and DiscreteVAE built on the meta device.

Parameters are the meta model's `parameters()`, so a module shared by several layers
(--shared_attn_ids / --shared_ff_ids) and the tied embeddings (--share_input_output_emb)
count once; FSDP's units are the ones train shards (Transformer.shard_groups: blocks that
share a module are one unit).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.dalle import DALLE
from dalle_dist.model.vae import DiscreteVAE


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
