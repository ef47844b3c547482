"""The optimizers `train` and `train-vae` step: Adam, or AdamW with decay on the weights
of the Linear layers only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn


def _fusable(params: list[nn.Parameter]) -> bool:
    return all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for p in params)


def make_adam(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam, fused into one kernel per step where torch supports it (CPU and CUDA floats).

    The unfused loop is a noticeable part of a small model's step; the fused kernel costs
    a fraction of it (figures: docs/benchmarks.md, "Training").
    """
    params = list(params)
    return torch.optim.Adam(params, lr=lr, fused=_fusable(params) or None)


def decays(name: str, param: nn.Parameter, embeddings: set[str]) -> bool:
    """Whether weight decay applies: matrices, except embedding tables (a token seldom
    seen would shrink towards 0 between its gradients). Norm gains, biases and LayerScale
    vectors are 1-D and never decay, as is usual (GPT-2, LlamaGen). A ZeRO-3 parameter is
    judged by its whole shape (`ds_shape`): its own tensor is an empty stand-in by the
    time the optimizer is built."""
    return len(getattr(param, "ds_shape", param.shape)) >= 2 and name not in embeddings


def make_optimizer(params: Iterable[nn.Parameter], kind: str, lr: float,
                   betas: tuple[float, float], weight_decay: float,
                   names: Mapping[int, str], embeddings: set[str]) -> torch.optim.Optimizer:
    """Adam or AdamW ("adam", "adamw"), fused where torch supports it. With weight decay,
    two parameter groups: [decayed, not decayed] (`decays`), each parameter named by
    `names` (id -> its name in the model, which the backends' wrapping and sharding keep);
    without, one group, as make_adam's. `embeddings`: the names of embedding weights."""
    params = list(params)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    options = {"lr": lr, "betas": betas, "fused": _fusable(params) or None}
    if not weight_decay:
        return cls(params, weight_decay=0.0, **options)
    decayed = {id(p) for p in params if decays(names.get(id(p), ""), p, embeddings)}
    groups = [{"params": [p for p in params if id(p) in decayed], "weight_decay": weight_decay},
              {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0}]
    return cls([g for g in groups if g["params"]], **options)


def embedding_weights(model: nn.Module) -> set[str]:
    """The names of `model`'s nn.Embedding weights (DALL-E's token and position tables
    are all nn.Embedding)."""
    return {f"{prefix}.weight" if prefix else "weight"
            for prefix, module in model.named_modules() if isinstance(module, nn.Embedding)}
