"""`torch`: DistributedDataParallel, gloo on CPU and nccl on CUDA, launched by torchrun."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dalle_dist.backends.engine import Engine, OptimizerFactory, SchedulerFactory
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.torch_dist import TorchDistributedBackend


class DDPEngine(Engine):
    """Forward goes through DDP (which all-reduces gradients in backward); the rest is local."""

    def __init__(self, ddp: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        super().__init__(ddp.module, *args, **kwargs)
        self.ddp = ddp

    def _wrapped_forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp(*args, **kwargs)

    def _gradient_sync(self, sync: bool) -> AbstractContextManager[None]:
        """DDP all-reduces in backward unless inside no_sync (which must also cover the
        forward: DDP prepares its buckets there)."""
        return contextlib.nullcontext() if sync else self.ddp.no_sync()


class TorchBackend(TorchDistributedBackend):
    name = "torch"
    # gradient_as_bucket_view is off: the buckets hold a copy of every gradient.
    plan_terms = PlanTerms("torch DDP", cost_rank=(1,), gradient_copies=("ddp_buckets",))

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None) -> Engine:
        device, precision = self.device, self.precision()
        module = module.to(device)
        module, optimizer = precision.prepare(module, make_optimizer(module.parameters()))
        # DDP broadcasts rank 0's parameters and buffers here: every rank starts equal.
        ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda"
                                      else None)
        return DDPEngine(ddp, optimizer, make_scheduler(optimizer), precision,
                         is_root=self.is_root, watch=self.watch, ga_steps=self.ga_steps)
