"""Token sampling: top-k filtering and temperature, with an explicit generator."""

from __future__ import annotations

import torch
from torch import Tensor


def top_k_filter(logits: Tensor, filter_thres: float) -> Tensor:
    """Keep the top (1 - filter_thres) fraction of logits (at least one); -inf the rest.

    filter_thres follows DALLE-pytorch: 0.9 keeps the best 10% of the vocabulary.
    """
    k = max(int((1.0 - filter_thres) * logits.shape[-1]), 1)
    values, indices = logits.topk(k, dim=-1)
    return torch.full_like(logits, float("-inf")).scatter_(-1, indices, values)


def sample_tokens(logits: Tensor, filter_thres: float, temperature: float,
                  generator: torch.Generator | None = None) -> Tensor:
    """One token per row by the Gumbel-max trick.

    The noise is drawn for the whole row whatever the logits are, so two computations of
    nearly equal logits (cached and uncached sampling) consume the generator identically.
    """
    # float32 at least: Gumbel noise drawn in bf16 skews the distribution badly.
    filtered = top_k_filter(logits.float() if logits.dtype in (torch.float16, torch.bfloat16)
                            else logits, filter_thres)
    uniform = torch.rand(filtered.shape, generator=generator, device=logits.device,
                         dtype=filtered.dtype)
    gumbel = -torch.log((-torch.log(uniform.clamp_min(1e-20))).clamp_min(1e-20))
    return (filtered / max(temperature, 1e-6) + gumbel).argmax(dim=-1)


def null_text(text: Tensor) -> Tensor:
    """The null caption of classifier-free guidance for each row of [b, text_seq_len]
    captions: all padding (id 0), what --null_cond_prob trains the model on."""
    return torch.zeros_like(text)


def guide(cond: Tensor, null: Tensor, cond_scale: float) -> Tensor:
    """Classifier-free guidance: null + (cond - null) x cond_scale, before any filtering
    (as DALLE-pytorch's generate_images). cond_scale 1 is the conditional logits."""
    return null + (cond - null) * cond_scale
