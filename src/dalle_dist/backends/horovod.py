"""`horovod`: Horovod's DistributedOptimizer over Gloo (CPU) or NCCL, launched by horovodrun.

--batch_size is per worker here, as in Horovod's own examples; the log states the
effective global batch. Parameters are broadcast from rank 0 at the start, optimizer
state when a run resumes.
Horovod is imported only inside methods.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dalle_dist.backends.base import DistributedBackend, Engine, OptimizerFactory, SchedulerFactory
from dalle_dist.backends.torch_dist import set_cpu_threads


class HorovodEngine(Engine):
    """Gradients are all-reduced asynchronously during backward; clipping must wait for them.

    So clip_grad_norm synchronizes first, and step then skips the synchronization it
    would otherwise do itself.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.synchronized = False

    def clip_grad_norm(self, max_norm: float | None) -> float | None:
        if not max_norm:
            return None
        self.optimizer.synchronize()
        self.synchronized = True
        return super().clip_grad_norm(max_norm)

    def step(self) -> None:
        skip = self.optimizer.skip_synchronize() if self.synchronized else contextlib.nullcontext()
        with skip:
            super().step()
        self.synchronized = False

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()  # Horovod's takes no set_to_none (torch's default is True)


class HorovodBackend(DistributedBackend):
    name = "horovod"
    extra = "horovod"
    launch_hint = ("horovodrun -np N python -m dalle_dist train --distributed_backend horovod "
                   "(Horovod 0.28.1 needs scripts/build_horovod.sh against current torch)")
    batch_size_is_global = False


    def bound_waits(self) -> None:
        """--collective_timeout (plus the watchdog's grace) as Horovod's own bounds, read by
        hvd.init(): its gloo context's timeout (a stopped peer) and the stall shutdown (a
        peer that never submits the same tensor); the stall warning comes earlier."""
        bound = str(int(self.engine_timeout.total_seconds()))
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = bound
        os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = bound
        warn = max(1, int(min(60.0, self.collective_timeout / 2)))
        yours = os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "")
        if not yours.isdigit() or int(yours) > warn:  # a lower one of the user's stays
            os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(warn)

    def initialize(self) -> None:
        import horovod.torch as hvd

        self.bound_waits()
        hvd.init()
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.local_rank, self.local_world_size = hvd.local_rank(), hvd.local_size()
        device = self.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            set_cpu_threads(self.local_world_size)

    def shutdown(self) -> None:
        import horovod.torch as hvd

        hvd.shutdown()

    def _barrier(self) -> None:
        import horovod.torch as hvd

        hvd.barrier()

    def _average(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        import horovod.torch as hvd

        return hvd.allreduce(tensor.detach().float(), op=hvd.Average, name=name)

    def _all_gather_object(self, obj: Any, name: str) -> list[Any]:
        import horovod.torch as hvd

        return hvd.allgather_object(obj, name=name)

    def _broadcast_object(self, obj: Any, name: str) -> Any:
        import horovod.torch as hvd

        return hvd.broadcast_object(obj, root_rank=0, name=name)

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory, shard_units: Sequence[nn.Module] = (),
                   clip_grad_norm: float | None = None) -> Engine:
        import horovod.torch as hvd

        device, precision = self.device, self.precision()
        module = module.to(device)
        module, optimizer = precision.prepare(module, make_optimizer(module.parameters()))
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters())
        # A fresh optimizer is the same on every rank. Broadcasting it now would make
        # Horovod create its state with a zero-gradient step, leaving Adam one step ahead
        # of the other backends; a resumed state is read from the file by every rank.
        return HorovodEngine(module, optimizer, make_scheduler(optimizer), precision,
                             is_root=self.is_root, watch=self.watch)
