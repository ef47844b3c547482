"""The contract every distributed backend meets (docs/design.md, "Backends").

The training loop holds a DistributedBackend object and the Engine it returns; it never
asks which backend is running (docs/design.md, "Layers"). Nothing here knows about DALL-E:
models arrive as nn.Modules, optimizers and schedulers as factories (FSDP and DeepSpeed
must build them after they have wrapped or sharded the parameters).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.engine import Engine, OptimizerFactory, SchedulerFactory
from dalle_dist.backends.placement import check_explicit_gpu, rank_device
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision import Precision, apex_amp
from dalle_dist.backends.precision_kinds import PrecisionKind
from dalle_dist.backends.rank_errors import portable, rebuilt
from dalle_dist.backends.verdict import Verdict
from dalle_dist.backends.watch import ENGINE_GRACE_S, CollectiveWatch
from dalle_dist.errors import ConfigError, DalleDistError, PeerLost, Stopped
from dalle_dist.model.init import WeightStream

T = TypeVar("T")

#: Every backend class that names itself, by name, in the order they were defined;
#: backends/registry.py lists them in catalog.py's order (the only reader).
REGISTERED: dict[str, type[DistributedBackend]] = {}


class DistributedBackend(ABC):
    """How processes are started, talk to each other, and wrap the model.

    A backend is an object passed around (never module state). Its class registers itself
    by defining `name`, and declares, without importing its engine, everything the tools
    that judge it before a launch need: its flags, pip extra, launch hint, whether it can
    run here (`verdict`, what `dalle-dist check` prints and `train` stops on) and how it
    places the training state (`plan_terms`, what `dalle-dist plan` counts).
    """

    name: ClassVar[str]
    #: The pip extra that installs the engine, if it is not torch itself.
    extra: ClassVar[str | None] = None
    #: How to start N processes with this backend (for messages and docs).
    launch_hint: ClassVar[str] = ""
    #: True when --batch_size is the global batch split over ranks; False: per worker.
    batch_size_is_global: ClassVar[bool] = True
    #: True when its engine keeps optimizer state in its own checkpoint format (a resumed
    #: run then reads that directory as it is instead of consolidating it)
    has_native_checkpoint: ClassVar[bool] = False
    #: True when torch.distributed.checkpoint can save and load its engine's state (a
    #: torch process group, or one process): --checkpoint_format sharded
    saves_sharded: ClassVar[bool] = True
    #: The format a run writes without --checkpoint_format (checkpoint/formats.py)
    default_checkpoint_format: ClassVar[str] = "full"
    plan_terms: ClassVar[PlanTerms]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # intermediate bases (TorchDistributedBackend) name nothing
            REGISTERED[cls.name] = cls

    def __init__(self, settings: DistributedConfig) -> None:
        self.settings = settings
        self.use_apex = settings.amp
        self.precision_name: str = settings.precision_name
        device = settings.device
        self.requested_device = torch.device(device) if device else None
        self.collective_timeout = float(settings.collective_timeout)
        self.world_size, self.rank, self.local_rank = 1, 0, 0
        self.local_world_size = 1
        self._device: torch.device | None = None
        self._watch: CollectiveWatch | None = None

    # -- without an engine -------------------------------------------------------------

    @classmethod
    def verdict(cls, cuda: bool) -> Verdict:
        """Can it start here (on CUDA when `cuda`)? Cheap: only the engine's own import
        and torch's flags; never raises."""
        return Verdict(True)

    @classmethod
    def precision_verdict(cls, precision: PrecisionKind, cuda: bool) -> Verdict:
        """Can it train in `precision` here? The precision's own answer unless the engine
        refuses more."""
        return precision.verdict(cuda)

    @classmethod
    def engine_facts(cls) -> dict[str, Any] | None:
        """What `dalle-dist check` reports about the engine beyond torch (None: torch only)."""
        return None

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
        """This rank's device, chosen once by select_device (initialize() chooses it)."""
        if self._device is None:
            return self.select_device(self.local_world_size)
        return self._device

    def select_device(self, local_ranks: int | None, gpus: int | None = None) -> torch.device:
        """Choose this rank's device: --device as given, but `cuda` without an index (or no
        --device on a machine with GPUs) is the rank's own GPU, refused with a ConfigError
        when this machine runs more ranks than it has GPUs (rank_device). Called by
        initialize() once the ranks are known, before the process group is joined.

        local_ranks: the ranks on this machine, None when the launcher does not say (then
        only the ranks past the last GPU can tell, and the others time out waiting).
        gpus: the GPUs this process sees (None: ask torch).
        """
        if gpus is None:
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        requested = self.requested_device
        if requested is not None and (requested.type != "cuda" or requested.index is not None):
            check_explicit_gpu(requested, local_ranks or self.local_rank + 1, gpus)
            device = requested
        elif gpus == 0:
            device = requested or torch.device("cpu")
        else:
            device = rank_device(self.local_rank, local_ranks or self.local_rank + 1,
                                 gpus, self.launch_line(),
                                 os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._device = device
        return device

    def launch_line(self) -> str:
        """How to start this backend, with N for the number of ranks (launch_hint without
        its bracketed note)."""
        return self.launch_hint.split(" (")[0].replace("NAME", self.name)

    # -- waiting for the other ranks (docs/design.md, "No silent hangs") ----------------

    @property
    def engine_timeout(self) -> timedelta:
        """What the engines' own timeouts get: a backstop behind the watchdog (watch.py)."""
        return timedelta(seconds=self.collective_timeout + ENGINE_GRACE_S)

    @property
    def watch(self) -> CollectiveWatch | None:
        """This rank's waits (None in one process: there is nobody to wait for)."""
        if self._watch is None and self.world_size > 1:
            self._watch = CollectiveWatch(self.collective_timeout, self.rank)
        return self._watch

    def waiting(self, name: str) -> AbstractContextManager[None]:
        """A block in which this rank may wait for the others: bounded by
        --collective_timeout, and named in the error when a peer fails."""
        watch = self.watch
        return watch.waiting(name) if watch is not None else contextlib.nullcontext()

    def start_watch(self, on_expire: Callable[[PeerLost], object]) -> None:
        """Run the watchdog of a multi-rank run; on_expire(error) must end the process."""
        if self.watch is not None:
            self.watch.start(on_expire)

    # -- collectives: each one named, for Horovod and for the error that names a wait ----

    def barrier(self, name: str) -> None:
        """Wait for every rank."""
        if self.world_size > 1:
            with self.waiting(name):
                self._barrier()

    def average_to_host(self, tensor: torch.Tensor, name: str) -> list[float]:
        """Mean of `tensor` over ranks, read back to the host inside the named wait. On NCCL
        the all-reduce returns at once and the rank waits in the read (`.tolist()`), so a
        read outside the block would wait unnamed and unbounded by --collective_timeout
        (docs/design.md, "No silent hangs"). A host synchronisation: logging steps only."""
        if self.world_size == 1:
            return tensor.detach().float().tolist()
        with self.waiting(name):
            return self._average(tensor, name).tolist()

    def all_gather_object(self, obj: Any, name: str) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if self.world_size == 1:
            return [obj]
        with self.waiting(name):
            return self._all_gather_object(obj, name)

    def broadcast_object(self, obj: Any, name: str) -> Any:
        """Rank 0's `obj` on every rank (pickled: only for our own data, never user files).

        Every rank passes an object of the same type (None on the others is not: Horovod
        names an unnamed collective after the object's type, and dict meets NoneType
        never); `name` also names it explicitly.
        """
        if self.world_size == 1:
            return obj
        with self.waiting(name):
            return self._broadcast_object(obj, name)

    def _barrier(self) -> None:
        raise NotImplementedError

    def _average(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        raise NotImplementedError

    def _all_gather_object(self, obj: Any, name: str) -> list[Any]:
        raise NotImplementedError

    def _broadcast_object(self, obj: Any, name: str) -> Any:
        raise NotImplementedError

    # -- decisions every rank must share --------------------------------------------------

    def on_root(self, name: str, decide: Callable[[], T]) -> T:
        """`decide()` run on rank 0 alone (it reads files that may exist on rank 0's node
        only), its result, or the error it raised, on every rank: all take the same path."""
        if self.world_size == 1:
            return decide()
        outcome: dict[str, Any] = {"result": None, "error": None}
        if self.is_root:
            try:
                outcome["result"] = decide()
            except PeerLost:
                raise
            except (DalleDistError, Stopped) as exc:
                outcome["error"] = portable(exc)
        outcome = self.broadcast_object(outcome, name)
        if outcome["error"] is not None:
            raise rebuilt(outcome["error"], None, quiet=not self.is_root)
        return outcome["result"]

    def everywhere(self, name: str, work: Callable[[], T]) -> T:
        """`work()` on every rank; when it raised a user error on any rank, every rank
        raises it (naming the rank when the others succeeded), so none is left waiting
        in the next collective for a rank that has gone."""
        if self.world_size == 1:
            return work()
        try:
            result, error = work(), None
        except PeerLost:
            raise
        except DalleDistError as exc:
            result, error = None, portable(exc)
        errors = self.all_gather_object(error, name)
        failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
        if failed:
            rank, first = failed[0]
            raise rebuilt(first, rank if len(failed) < len(errors) else None)
        return result  # type: ignore[return-value]

    # -- batches -----------------------------------------------------------------------

    @property
    def ga_steps(self) -> int:
        """Micro-batches per optimizer step (--ga_steps), on every backend."""
        return self.settings.ga_steps

    def check_batch_size(self, batch_size: int) -> None:
        """Raise the same ConfigError on every rank when --batch_size cannot be split into
        ranks x --ga_steps micro-batches."""
        if batch_size <= 0:
            raise ConfigError(f"--batch_size must be positive, got {batch_size}")
        ga = self.ga_steps
        if ga <= 0:
            raise ConfigError(f"--ga_steps must be positive, got {ga}")
        ranks = self.world_size if self.batch_size_is_global else 1
        parts = ranks * ga
        if batch_size >= parts and batch_size % parts == 0:
            return
        lower = max(parts, batch_size // parts * parts)
        fix = f"use --batch_size {lower} or {lower + parts}"
        if ga == 1:
            raise ConfigError(f"--batch_size {batch_size} is the global batch of backend "
                              f"{self.name} and must be a multiple of the {ranks} ranks", fix)
        whose = (f"the global batch of backend {self.name}" if self.batch_size_is_global
                 else f"the per-worker batch of backend {self.name}")
        split = f"--ga_steps {ga} x {ranks} ranks ({parts})" if ranks > 1 else f"--ga_steps {ga}"
        raise ConfigError(f"--batch_size {batch_size} is {whose} and must be a multiple of "
                          f"{split}", fix)

    def rank_batch_size(self, batch_size: int) -> int:
        """Samples each rank draws per micro-batch: the batch split over the ranks (where
        it is global) and over the --ga_steps micro-batches of an optimizer step."""
        per_rank = batch_size // self.world_size if self.batch_size_is_global else batch_size
        return per_rank // self.ga_steps

    def check_config(self, batch_size: int) -> None:
        """Everything about the flags that can fail, checked before any model is built."""
        self.check_batch_size(batch_size)
        if self.use_apex:
            _, why_not = apex_amp(self.device)
            if why_not and self.is_root:
                print(why_not, flush=True)

    def prepare_compiled_blocks(self) -> None:
        """train --compile will compile each transformer block's call with fullgraph=True
        (called after check_config, before the model is built): a backend whose hooks
        would run inside a block (on its layers) moves them onto the block here (ZeRO-3's
        gathers), or refuses with a ConfigError. Hooks on the block itself (FSDP2's) or on
        the parameters' gradients (DDP's, Horovod's, ZeRO 1-2's) run outside the graph."""

    def precision(self) -> Precision:
        return Precision(self.precision_name, self.device, self.use_apex)

    # -- the engine --------------------------------------------------------------------

    def check_same_weights(self, heads: dict[str, bytes]) -> None:
        """Ranks that each filled their own shards (FSDP, ZeRO-3) did so from the same
        values: one gather of a 16-character digest per rank over the first elements of
        every full parameter (model.init.with_heads); the weights never travel. Replica
        engines need no such check: DDP, Horovod and ZeRO 0-2 broadcast rank 0's."""
        if self.world_size == 1:
            return
        digest = hashlib.sha256()
        for name in sorted(heads):
            digest.update(name.encode() + heads[name])
        digests = self.all_gather_object(digest.hexdigest()[:16], "the initial weight digests")
        if len(set(digests)) > 1:
            raise DalleDistError(
                f"the ranks built different initial weights (digests {', '.join(digests)})",
                "every rank must use the same --seed and read the same checkpoint file; "
                "resume from a file all nodes share")

    @abstractmethod
    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None,
                   weights: WeightStream | None = None) -> Engine:
        """Wrap `module` for this backend and build its optimizer and scheduler.

        shard_units: submodules a sharding backend (FSDP) may shard one by one; a list
            is one unit of several modules (blocks that share a module).
        clip_grad_norm: for engines that clip inside their step (DeepSpeed).
        """
