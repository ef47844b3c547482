"""The contract every distributed backend meets, and the engine it hands the loop.

The training loop holds a DistributedBackend object and the Engine it returns; it never
asks which backend is running (DESIGN.md, "Layers"). Nothing here knows about DALL-E:
models arrive as nn.Modules, optimizers and schedulers as factories (FSDP and DeepSpeed
must build them after they have wrapped or sharded the parameters).
"""

from __future__ import annotations

import argparse
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from dalle_dist.backends.precision import Precision, apex_amp
from dalle_dist.checkpoint_io import keep_history, write_checkpoint_file
from dalle_dist.errors import ConfigError

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


def parameter_digest(state: dict[str, torch.Tensor]) -> str:
    """A short hash of every tensor's bytes, to tell whether ranks hold the same model."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def by_index(named: dict[str, Any], module: nn.Module, optimizer: torch.optim.Optimizer
             ) -> dict[str, Any]:
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


class Engine:
    """A model with its optimizer and scheduler, driven through one interface.

    This base runs the model as it is (one process, or replicas kept in step by a
    subclass); subclasses wrap DDP, FSDP, DeepSpeed or Horovod behind the same methods.
    """

    #: True when no single rank holds all weights (FSDP, ZeRO-3): gathering is collective.
    shards_parameters: ClassVar[bool] = False

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any | None, precision: Precision, is_root: bool = True) -> None:
        self.module = module  # the bare model: its state_dict has no wrapper prefixes
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.is_root = is_root

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            return self._call(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss, self.optimizer)

    def _parameters_to_clip(self) -> Iterable[torch.Tensor]:
        return self.module.parameters()

    def clip_grad_norm(self, max_norm: float | None) -> float | None:
        """Clip to max_norm and return the norm before clipping (None: no clipping)."""
        if not max_norm:
            return None
        if self.precision.scaler is not None:
            self.precision.scaler.unscale_(self.optimizer)
        return float(torch.nn.utils.clip_grad_norm_(self._parameters_to_clip(), max_norm))

    def step(self) -> None:
        scaler = self.precision.scaler
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.step(self.optimizer)
            scaler.update()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- state -----------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """All weights, unsharded, on the root rank (None elsewhere). Collective if sharded."""
        return self.module.state_dict()

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        """The optimizer state keyed by parameter name, on the root rank (collective if
        sharded): the same form from every backend, so a checkpoint resumes on any other.

        None before the first step: there is no state yet, and asking for it would make
        torch initialise it with a zero-gradient step (Adam's step count one ahead).
        """
        if not self.optimizer.state:
            return None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(self.module, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True))

    def rank_digest(self) -> str:
        """Hash of the full weights as this rank sees them (sharded engines gather first)."""
        return parameter_digest(self.module.state_dict())

    def save(self, path: str | Path, meta: dict[str, Any], keep_n: int | None = None) -> None:
        """Write meta + weights + optimizer + scheduler as one file, from the root rank;
        keep_n: also keep it among the newest N in `<name>-checkpoints/`.

        Every rank calls it (gathering a sharded model is collective); only the root writes.
        """
        weights, optimizer = self.full_state_dict(), self.optimizer_state_dict()
        if self.is_root:
            scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
            write_checkpoint_file(path, {**meta, "weights": weights, "optimizer": optimizer,
                                         "scheduler": scheduler})
            if keep_n:
                keep_history(path, meta["step"], keep_n)

    def load_training_state(self, payload: dict[str, Any]) -> str | None:
        """Restore optimizer and scheduler state from a checkpoint (the weights are loaded
        before the model is wrapped). Returns why the optimizer starts fresh, if it does."""
        optimizer = payload.get("optimizer")
        if self.scheduler is not None and payload.get("scheduler"):
            self.scheduler.load_state_dict(payload["scheduler"])
        if not optimizer:
            return None if payload.get("step", 0) == 0 else "the checkpoint holds none"
        self._load_optimizer(optimizer)
        return None

    def _load_optimizer(self, optimizer: dict[str, Any]) -> None:
        """Name-keyed state back into the optimizer's own index-keyed form.

        Not torch's set_optimizer_state_dict: on a fresh optimizer it first takes a
        zero-gradient step and calls zero_grad(set_to_none=True), which Horovod's
        DistributedOptimizer does not accept.
        """
        if not all(isinstance(k, int) for k in optimizer.get("state", {})):
            optimizer = by_index(optimizer, self.module, self.optimizer)
        self.optimizer.load_state_dict(optimizer)


class DistributedBackend(ABC):
    """How processes are started, talk to each other, and wrap the model.

    A backend is an object passed around (never module state). Its class says which flags
    it adds without importing its engine; whether it can run here is
    environment.backend_verdict's answer, shared with `dalle-dist check`.
    """

    name: ClassVar[str]
    #: The pip extra that installs the engine, if it is not torch itself.
    extra: ClassVar[str | None] = None
    #: How to start N processes with this backend (for messages and docs).
    launch_hint: ClassVar[str] = ""
    #: True when --batch_size is the global batch split over ranks; False: per worker.
    batch_size_is_global: ClassVar[bool] = True

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.use_apex = bool(getattr(args, "amp", False))
        self.precision_name: str = "fp16" if self.use_apex else getattr(args, "precision", "fp32")
        device = getattr(args, "device", None)
        self.requested_device = torch.device(device) if device else None
        self.world_size, self.rank, self.local_rank = 1, 0, 0
        self.local_world_size = 1

    # -- without an engine -------------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Flags only this backend reads (added for every backend, so --help lists them)."""

    # -- process group -----------------------------------------------------------------

    @abstractmethod
    def initialize(self) -> None:
        """Join the process group; after it, world_size, rank and local_rank hold."""

    def shutdown(self) -> None:
        """Leave the process group (nothing to leave in one process)."""

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def is_local_root(self) -> bool:
        return self.local_rank == 0

    @property
    def device(self) -> torch.device:
        if self.requested_device is not None:
            return self.requested_device
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for in one process)."""

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of `tensor` over ranks."""
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        return [obj]

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled: only for our own data, never user files)."""
        return obj

    # -- batches -----------------------------------------------------------------------

    def check_batch_size(self, batch_size: int) -> None:
        """Raise the same ConfigError on every rank when --batch_size cannot be split."""
        if batch_size <= 0:
            raise ConfigError(f"--batch_size must be positive, got {batch_size}")
        if not self.batch_size_is_global or self.world_size == 1:
            return
        if batch_size < self.world_size or batch_size % self.world_size:
            lower = max(self.world_size, batch_size // self.world_size * self.world_size)
            raise ConfigError(
                f"--batch_size {batch_size} is the global batch of backend {self.name} and "
                f"must be a multiple of the {self.world_size} ranks",
                f"use --batch_size {lower} or {lower + self.world_size}")

    def rank_batch_size(self, batch_size: int) -> int:
        """Samples each rank draws per step."""
        return batch_size // self.world_size if self.batch_size_is_global else batch_size

    def check_config(self, batch_size: int) -> None:
        """Everything about the flags that can fail, checked before any model is built."""
        self.check_batch_size(batch_size)
        if self.use_apex:
            _, why_not = apex_amp(self.device)
            if why_not and self.is_root:
                print(why_not, flush=True)

    def precision(self) -> Precision:
        return Precision(self.precision_name, self.device, self.use_apex)

    # -- the engine --------------------------------------------------------------------

    @abstractmethod
    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory, shard_units: Sequence[nn.Module] = (),
                   clip_grad_norm: float | None = None) -> Engine:
        """Wrap `module` for this backend and build its optimizer and scheduler.

        shard_units: submodules a sharding backend (FSDP) may shard one by one.
        clip_grad_norm: for engines that clip inside their step (DeepSpeed).
        """
