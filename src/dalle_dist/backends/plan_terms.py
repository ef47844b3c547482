"""How a backend places the training state on each GPU, as `dalle-dist plan` counts it.

A backend declares these facts next to its code; plan/rows.py turns them into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: replicated: every GPU holds the whole model, its gradients and optimizer state;
#: fully_shard: FSDP2, each / N, the root module and two blocks gathered at a time;
#: zero: DeepSpeed ZeRO, what is split over the N GPUs grows with the stage (0-3).
Sharding = Literal["replicated", "fully_shard", "zero"]


@dataclass(frozen=True)
class PlanTerms:
    #: The recommendation's name for it; "{stage}" stands for the ZeRO stage.
    label: str
    #: Per ZeRO stage, the place in plan's cheapest-first order over every backend's rows
    #: (communication volume, then set-up): the recommendation takes the first that fits.
    cost_rank: tuple[int, ...]
    zero_stages: tuple[int | None, ...] = (None,)
    #: Runs the whole batch on one GPU, whatever --gpus says.
    one_gpu: bool = False
    sharding: Sharding = "replicated"
    #: The precisions in which the whole module is cast to the precision (its weights
    #: and gradients in 2 bytes, the fp32 master copy in the optimizer) instead of kept
    #: fp32 under autocast: DeepSpeed's fp16 section.
    casts_model: tuple[str, ...] = ()
    #: The gradients live in buffers allocated once and kept from step to step (DDP's
    #: buckets under gradient_as_bucket_view), not allocated by backward and freed by
    #: zero_grad: resident memory, and no second copy.
    resident_grads: bool = False
    #: Buffers of a fixed size, (item name, bytes).
    fixed_buffers: tuple[tuple[str, int], ...] = ()

    def rows(self) -> list[tuple[int | None, int]]:
        """(ZeRO stage, cost rank) of each row this backend adds to a plan."""
        return list(zip(self.zero_stages, self.cost_rank, strict=True))

    def name_at(self, stage: int | None) -> str:
        return self.label.format(stage=stage)
