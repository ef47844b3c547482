"""What the torch.distributed backends (torch DDP, FSDP) share: joining from torchrun's env.

torchrun (and any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT) starts the processes, or srun, whose task variables become those
(backends/slurm.py); gloo carries CPU tensors, nccl CUDA ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dalle_dist.backends.contract import DistributedBackend
from dalle_dist.backends.slurm import adopt_step_env
from dalle_dist.backends.verdict import Verdict
from dalle_dist.errors import ConfigError

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def restart_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """torchrun's key-value store, with keys private to this attempt of the group.

    After `torchrun --max-restarts` restarts a group, the store can still hold the
    addresses the killed group's ranks published; gloo then dials a dead rank ("Connection
    refused") when its peer reads the stale key first (seen often in restart tests:
    docs/benchmarks.md, "Failures and hangs").
    """
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    else:  # rank 0 hosts it (bare processes given a launcher's variables)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                              multi_tenant=True)
    return dist.PrefixStore(f"dalle_dist/attempt_{attempt}", store)


def local_ranks_from_env(environ: Mapping[str, str]) -> int | None:
    """How many ranks the launcher started on this machine: torchrun says LOCAL_WORLD_SIZE,
    the deepspeed launcher LOCAL_SIZE; None when neither does (a launcher of one's own)."""
    local = environ.get("LOCAL_WORLD_SIZE") or environ.get("LOCAL_SIZE")
    return int(local) if local else None


def set_cpu_threads(local_world_size: int) -> None:
    """Share the cores between the ranks of one machine unless OMP_NUM_THREADS says otherwise.

    Two ranks with torch's default of one thread per core would each try to use every core.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local_world_size, 1)))


class TorchDistributedBackend(DistributedBackend):
    """A backend whose ranks talk through torch.distributed's default process group."""

    launch_hint = "torchrun --nproc_per_node N -m dalle_dist train --distributed_backend NAME"

    @classmethod
    def verdict(cls, cuda: bool) -> Verdict:
        """Usable when this torch has the process group its tensors need (nccl on CUDA)."""
        wire = "nccl" if cuda else "gloo"
        compiled = dist.is_available() and (dist.is_nccl_available() if cuda else
                                            dist.is_gloo_available())
        if not compiled:
            return Verdict(False, f"this torch has no {wire} process group", "install a torch "
                           f"build with {wire} (the PyPI wheels have it)")
        return Verdict(True)

    def initialize(self) -> None:
        adopt_step_env()  # srun as the launcher: its task's variables (backends/slurm.py)
        missing = [name for name in LAUNCH_ENV if name not in os.environ]
        if missing:
            raise ConfigError(
                f"backend {self.name} found no launcher environment ({', '.join(missing)} "
                "unset)", f"start it with: {self.launch_hint.replace('NAME', self.name)}")
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        local = local_ranks_from_env(os.environ)
        self.local_world_size = local or self.world_size
        # Before the group is joined: a machine with too few GPUs stops all its ranks here.
        device = self.select_device(local)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            set_cpu_threads(self.local_world_size)
        if not dist.is_initialized():
            with self.waiting("joining the process group"):
                self.init_process_group(device)

    def init_process_group(self, device: torch.device) -> None:
        """Every wait of the group (and of its rendezvous) ends after engine_timeout."""
        timeout = self.engine_timeout
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                store=restart_store(self.rank, self.world_size, timeout),
                                rank=self.rank, world_size=self.world_size,
                                device_id=device if device.type == "cuda" else None)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def _barrier(self) -> None:
        dist.barrier()

    def _average(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        tensor = tensor.detach().clone().float()
        dist.all_reduce(tensor)
        return tensor / self.world_size

    def _all_gather_object(self, obj: Any, name: str) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def _broadcast_object(self, obj: Any, name: str) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
