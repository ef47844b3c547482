"""`horovod`: Horovod's DistributedOptimizer over Gloo (CPU) or NCCL, launched by horovodrun.

--batch_size is per worker here, as in Horovod's own examples; the log states the
effective global batch. Parameters are broadcast from rank 0 at the start, optimizer
state when a run resumes.
Horovod is imported only inside methods.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dalle_dist.backends.contract import DistributedBackend
from dalle_dist.backends.engine import Engine, OptimizerFactory, SchedulerFactory
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.slurm import check_horovod_launch
from dalle_dist.backends.torch_dist import set_cpu_threads
from dalle_dist.backends.verdict import Verdict, error_line, installed_version
from dalle_dist.model.init import WeightStream, placed

#: HOROVOD_FUSION_THRESHOLD's default: the buffer small tensors are fused in for all-reduce.
FUSION_BUFFER_BYTES = 64 * 2**20


class HorovodEngine(Engine):
    """Gradients are all-reduced asynchronously during backward, in place: whatever reads
    them (clipping, fp16's unscale and inf check) must wait for them.

    So every optimizer step synchronizes first, before clipping or unscaling, and steps
    Horovod's optimizer inside skip_synchronize (its own step would synchronize again, and
    all-reduce every gradient a second time). fp16 needs the wait twice over: unscaling a
    gradient Horovod is still writing races with the all-reduce, and a rank that read its
    own inf before the average reached the others would skip a step they take. After it,
    an inf on one rank is in every rank's averaged gradient, so all skip together.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.synchronized = False

    def _synchronize(self) -> None:
        """Wait for this step's gradient all-reduces (once per step)."""
        if not self.synchronized:
            self.optimizer.synchronize()
            self.synchronized = True

    def _unscale(self) -> None:
        self._synchronize()
        super()._unscale()

    def clip_grad_norm(self, max_norm: float | None) -> torch.Tensor | None:
        if not max_norm:
            return None
        self._synchronize()
        return super().clip_grad_norm(max_norm)

    def step(self) -> None:
        self._synchronize()
        with self.optimizer.skip_synchronize():
            super().step()
        self.synchronized = False

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()  # Horovod's takes no set_to_none (torch's default is True)


class HorovodBackend(DistributedBackend):
    name = "horovod"
    saves_sharded = False  # no torch.distributed process group for DCP
    extra = "horovod"
    launch_hint = ("horovodrun -np N python -m dalle_dist train --distributed_backend horovod "
                   "(Horovod 0.28.1 needs scripts/build_horovod.sh against current torch)")
    batch_size_is_global = False
    plan_terms = PlanTerms("Horovod", cost_rank=(2,),
                           fixed_buffers=(("fusion_buffer", FUSION_BUFFER_BYTES),))

    @classmethod
    def verdict(cls, cuda: bool) -> Verdict:
        try:
            import horovod.torch as hvd
        except Exception as exc:
            return Verdict(False, f"Horovod's torch support is not importable "
                           f"({error_line(exc)})", "build it with scripts/build_horovod.sh "
                           "(Horovod 0.28.1 needs a C++17 patch against current torch), then "
                           f"pip install 'dalle_dist[{cls.extra}]'")
        if not (hvd.gloo_built() or hvd.mpi_built()):
            return Verdict(False, "Horovod was built without Gloo and without MPI",
                           "rebuild it with scripts/build_horovod.sh (HOROVOD_WITH_GLOO=1)")
        if cuda and not (hvd.cuda_built() or hvd.rocm_built()):
            # Without GPU operations (HAVE_GPU) its first collective on a GPU tensor fails:
            # "Requested ReadyEvent with GPU device but not compiled with CUDA".
            return Verdict(False, "this Horovod was built without GPU operations: its first "
                           "collective on a GPU tensor would fail",
                           "rebuild it on this machine with scripts/build_horovod.sh, which "
                           "builds NCCL operations for a CUDA torch (HOROVOD_GPU_OPERATIONS=NCCL; "
                           "needs nvcc and NCCL's headers)")
        if cuda and not hvd.nccl_built():
            return Verdict(True, "without NCCL: GPU tensors go through host memory")
        return Verdict(True)

    @classmethod
    def engine_facts(cls) -> dict[str, Any]:
        """Version, and what this build of Horovod's torch support can talk over."""
        facts: dict[str, Any] = {"installed": importlib.util.find_spec("horovod") is not None,
                                 "version": installed_version("horovod"), "torch_built": False,
                                 "error": None, "controllers": {}, "tensor_operations": {}}
        if not facts["installed"]:
            return facts
        try:
            import horovod.torch as hvd
        except Exception as exc:
            facts["error"] = error_line(exc)
            return facts
        facts["torch_built"] = True
        facts["controllers"] = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}
        facts["tensor_operations"] = {name: bool(getattr(hvd, f"{name}_built")())
                                      for name in ("nccl", "gloo", "mpi", "ddl", "ccl")}
        facts["cuda_built"] = bool(hvd.cuda_built())
        return facts

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

        check_horovod_launch()  # plain srun: every task would be a world of one
        self.bound_waits()
        hvd.init()
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.local_rank, self.local_world_size = hvd.local_rank(), hvd.local_size()
        # Every local rank has passed hvd.init's rendezvous and none waits on another yet:
        # a machine with too few GPUs stops all its ranks here.
        device = self.select_device(self.local_world_size)
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
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None,
                   weights: WeightStream | None = None) -> Engine:
        import horovod.torch as hvd

        device, precision = self.device, self.precision()
        module = placed(module, weights, device)
        module, optimizer = precision.prepare(module, make_optimizer(module.parameters()))
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        # backward_passes_per_step: each gradient is all-reduced once per --ga_steps
        # micro-batches, after the window's last backward (our loss is already / ga).
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters(),
                                             backward_passes_per_step=self.ga_steps)
        # A fresh optimizer is the same on every rank. Broadcasting it now would make
        # Horovod create its state with a zero-gradient step, leaving Adam one step ahead
        # of the other backends; a resumed state is read from the file by every rank.
        return HorovodEngine(module, optimizer, make_scheduler(optimizer), precision,
                             is_root=self.is_root, watch=self.watch, ga_steps=self.ga_steps)
