"""`single`: one process, one device. The default, and the reference the others must match."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.contract import DistributedBackend
from dalle_dist.backends.engine import Engine, OptimizerFactory, SchedulerFactory
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision_kinds import DEFAULT_PRECISION
from dalle_dist.backends.slurm import check_single_launch
from dalle_dist.model.init import WeightStream, placed


class SingleBackend(DistributedBackend):
    name = "single"
    launch_hint = "dalle-dist train ..."
    plan_terms = PlanTerms("single GPU", cost_rank=(0,), one_gpu=True)

    @classmethod
    def on(cls, device: torch.device | None = None, precision: str = DEFAULT_PRECISION
           ) -> SingleBackend:
        """A single backend built in code rather than from the command line."""
        return cls(DistributedConfig(device=str(device) if device else None,
                                     precision=precision))

    def initialize(self) -> None:
        check_single_launch()  # srun -n 2 without a backend: two runs on the same files

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None,
                   weights: WeightStream | None = None) -> Engine:
        precision = self.precision()
        module = placed(module, weights, self.device)
        module, optimizer = precision.prepare(module, make_optimizer(module.parameters()))
        return Engine(module, optimizer, make_scheduler(optimizer), precision,
                      ga_steps=self.ga_steps)
