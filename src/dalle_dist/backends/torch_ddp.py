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
from dalle_dist.model.init import WeightStream, placed


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
    # gradient_as_bucket_view: the gradients are views into the all-reduce buckets.
    plan_terms = PlanTerms("torch DDP", cost_rank=(1,), resident_grads=True)

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None,
                   weights: WeightStream | None = None) -> Engine:
        device, precision = self.device, self.precision()
        module = placed(module, weights, device)
        module, optimizer = precision.prepare(module, make_optimizer(module.parameters()))
        # DDP broadcasts rank 0's parameters and buffers here: every rank starts equal.
        # gradient_as_bucket_view: each gradient is a view into its all-reduce bucket, so
        # backward writes no second copy. What the engine does to gradients stays in place
        # (clipping's and GradScaler's unscale's in-place multiplies, accumulation in
        # no_sync). zero_grad(set_to_none=True) drops the views: the next backward makes
        # each gradient afresh, and DDP copies it into its bucket and points .grad there
        # again, one parameter at a time (inside no_sync, where DDP's hooks wait, the
        # window's gradients stay fresh tensors until its last micro-batch).
        ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda"
                                      else None, gradient_as_bucket_view=True)
        return DDPEngine(ddp, optimizer, make_scheduler(optimizer), precision,
                         is_root=self.is_root, watch=self.watch, ga_steps=self.ga_steps)
