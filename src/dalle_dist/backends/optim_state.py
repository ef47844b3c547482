"""Optimizer state re-keyed from parameter names to the optimizer's own indices.

Checkpoints keep optimizer state keyed by parameter name (torch.distributed.checkpoint's
form, the same from every backend), so a run resumes on any backend (docs/design.md,
"Checkpoints"); `optimizer.load_state_dict` takes it keyed by index.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dalle_dist.errors import ConfigError


def optimizer_state_by_index(named: dict[str, Any], module: nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (torch.distributed.checkpoint's form)
    in the index-keyed form `optimizer.load_state_dict` takes."""
    names = {id(p): n for n, p in module.named_parameters()}
    index = {names[id(p)]: i for i, p in
             enumerate(p for group in optimizer.param_groups for p in group["params"])}
    missing = [n for group in named["param_groups"] for n in group["params"] if n not in index]
    if missing:
        raise ConfigError(f"the checkpoint's optimizer state names parameters this model "
                          f"lacks ({', '.join(missing[:3])})",
                          "resume with the model the checkpoint was trained with")
    return {"state": {index[n]: v for n, v in named["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in named["param_groups"]]}
