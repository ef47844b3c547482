"""The contract every distributed backend meets, and the engine it hands the loop.

The training loop holds a DistributedBackend object and the Engine it returns; it never
asks which backend is running (DESIGN.md, "Layers"). Nothing here knows about DALL-E:
models arrive as nn.Modules, optimizers and schedulers as factories (FSDP and DeepSpeed
must build them after they have wrapped or sharded the parameters).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision import (
    Precision,
    PrecisionKind,
    apex_amp,
)
from dalle_dist.backends.verdict import Verdict
from dalle_dist.backends.watch import ENGINE_GRACE_S, CollectiveWatch
from dalle_dist.errors import ConfigError, DalleDistError, PeerLost, Stopped

T = TypeVar("T")
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


def parameter_digest(state: dict[str, torch.Tensor]) -> str:
    """A short hash of every tensor's bytes, to tell whether ranks hold the same model."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _replicated(norm: torch.Tensor) -> torch.Tensor:
    """A norm computed over sharded (DTensor) gradients as a plain tensor: the shards'
    partial sums are reduced on the device, with no host synchronisation."""
    full_tensor = getattr(norm, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else norm


def rank_device(local_rank: int, local_ranks: int, gpus: int, launch: str,
                cuda_visible_devices: str | None = None) -> torch.device:
    """Local rank `local_rank`'s own GPU, `cuda:local_rank` (the CPU when `gpus` is 0).

    `local_ranks` ranks on a machine with `gpus` visible GPUs need one GPU each; with
    fewer GPUs this raises instead of doubling up (the old `local_rank % gpus` put two
    ranks on one GPU: two models and optimizers in its memory, and NCCL stopping at its
    first collective with "Duplicate GPU detected"). Every input is a count all ranks of a
    machine see alike, so all of them raise, before any of them waits for another.

    launch: the backend's launch line with N for the number of ranks (its launch_hint),
    shown with N = gpus as the fix. cuda_visible_devices: this rank's CUDA_VISIBLE_DEVICES;
    one GPU listed there may be a scheduler's per-rank binding (each rank sees its own GPU
    as cuda:0), which the user states with --device cuda:0.
    """
    if gpus <= 0:
        return torch.device("cpu")
    ranks = max(local_ranks, local_rank + 1)
    if ranks > gpus:
        line = re.sub(r"\bN\b", str(gpus), launch)
        fix = f"start at most {gpus} rank(s) per machine, one per GPU: {line}"
        if gpus == 1 and cuda_visible_devices:
            fix += ("; or, where each rank sees a GPU of its own through "
                    "CUDA_VISIBLE_DEVICES, pass --device cuda:0")
        raise ConfigError(f"{ranks} ranks on this machine but {gpus} visible GPU(s): "
                          "ranks would have to share a GPU", fix)
    return torch.device("cuda", local_rank)


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


class Engine:
    """A model with its optimizer and scheduler, driven through one interface.

    This base runs the model as it is (one process, or replicas kept in step by a
    subclass); subclasses wrap DDP, FSDP, DeepSpeed or Horovod behind the same methods.
    """

    #: True when no single rank holds all weights (FSDP, ZeRO-3): gathering is collective.
    shards_parameters: ClassVar[bool] = False
    #: True when the engine keeps its optimizer state in its own checkpoint format
    #: (DeepSpeed's partitions), written and read through save_native / load_native.
    has_native_checkpoint: ClassVar[bool] = False

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any | None, precision: Precision, is_root: bool = True,
                 watch: CollectiveWatch | None = None, ga_steps: int = 1) -> None:
        self.module = module  # the bare model: its state_dict has no wrapper prefixes
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.is_root = is_root
        self.watch = watch
        #: micro-batches per optimizer step (--ga_steps): each one's loss counts 1/ga_steps
        self.ga_steps = ga_steps
        self._last_micro = True  # is the micro-batch in flight the window's last?

    def micro_batch(self, last: bool) -> AbstractContextManager[None]:
        """Around the forward and backward of one micro-batch of an accumulation window.

        Only the window's `last` micro-batch synchronises gradients between ranks; the
        others accumulate locally (DDP's no_sync, FSDP2's requires_gradient_sync, Horovod's
        backward_passes_per_step, DeepSpeed's own boundary), so --ga_steps costs one
        gradient exchange per optimizer step on every backend."""
        self._last_micro = last
        return self._gradient_sync(last) if self.ga_steps > 1 else contextlib.nullcontext()

    def _gradient_sync(self, sync: bool) -> AbstractContextManager[None]:
        """Whether this micro-batch's backward exchanges gradients (one process: nothing to
        exchange)."""
        return contextlib.nullcontext()

    def working_alone(self) -> AbstractContextManager[None]:
        """Around work the root does while the others wait for it (writing a file): the
        root's own wait deadline pauses, so a slow disk cannot end it mid-write."""
        return self.watch.working_alone() if self.watch else contextlib.nullcontext()

    def _wrapped_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward through whatever wraps it (DDP, DeepSpeed's engine); here
        the bare module. Precision is forward's business."""
        return self.module(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            return self._wrapped_forward(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of one micro-batch's mean loss, added to those of the window's others:
        divided by ga_steps, the window's gradient is that of its whole batch's mean."""
        self.precision.backward(loss / self.ga_steps if self.ga_steps > 1 else loss,
                                self.optimizer)

    def _parameters_to_clip(self) -> Iterable[torch.Tensor]:
        return self.module.parameters()

    def clip_grad_norm(self, max_norm: float | None) -> torch.Tensor | None:
        """Clip to max_norm and return the norm before clipping, as a tensor on the device
        (None: no clipping). Never waits for the device: the norm is read at log steps."""
        if not max_norm:
            return None
        self._unscale()
        return _replicated(torch.nn.utils.clip_grad_norm_(self._parameters_to_clip(), max_norm))

    def clip_and_step(self, max_norm: float | None) -> torch.Tensor | None:
        """Clip (when max_norm) and take the optimizer step. Returns the global gradient
        norm before clipping, on the device, None where it is not computed: logged, it is
        what shows a gradient summed instead of averaged over ranks (clipping and Adam hide
        it from the weights)."""
        norm = self.clip_grad_norm(max_norm)
        self.step()
        return norm

    #: fp16: the gradients of this step were unscaled already (by clipping)
    _unscaled: bool = False

    def _unscale(self) -> None:
        """fp16: divide the gradients by the loss scale and record whether any is inf/nan,
        once per optimizer step, before clipping and before the step (a no-op without a
        scaler). Every rank must find the same: a step is skipped on all ranks or on none.
        DDP's averaged gradients carry an inf to every rank, FSDP2's DTensor gradients
        all-reduce found-inf in GradScaler's unscale; engines whose gradients may still be
        in flight override it to wait for them first (Horovod)."""
        scaler = self.precision.scaler
        if scaler is None or self._unscaled:
            return
        scaler.unscale_(self.optimizer)
        self._unscaled = True

    def step(self) -> None:
        scaler = self.precision.scaler
        if scaler is None:
            self.optimizer.step()
        else:
            self._unscale()  # before scaler.step, which would unscale without the hook
            scaler.step(self.optimizer)
            scaler.update()
            self._unscaled = False

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def loss_scale(self) -> float | None:
        """fp16's current loss scale (None without a scaler); read at log steps only."""
        scaler = self.precision.scaler
        return None if scaler is None else float(scaler.get_scale())

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
        """Hash of the weights this rank holds: the whole model on replicas (all ranks must
        agree), the rank's own shard on sharded engines (shards differ by design)."""
        return parameter_digest(self.module.state_dict())

    def training_state(self) -> dict[str, Any]:
        """What a checkpoint keeps besides weights and optimizer, read on the root rank:
        the scheduler, and fp16's loss scale and its growth count (so a resumed run scales
        as before)."""
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
        scaler = self.precision.scaler.state_dict() if self.precision.scaler else None
        return {"scheduler": scheduler, "scaler": scaler}

    def save_native(self, directory: Path, tag: str, client_state: dict[str, Any]) -> None:
        """Every rank writes its part of the engine's own checkpoint as `directory/tag`."""
        raise NotImplementedError(f"{type(self).__name__} has no checkpoint format of its own")

    def load_native(self, directory: Path, tag: str) -> bool:
        """Load `directory/tag` of the engine's own format; False when the engine could not."""
        raise NotImplementedError(f"{type(self).__name__} has no checkpoint format of its own")

    def load_training_state(self, payload: dict[str, Any]) -> str | None:
        """Restore optimizer and scheduler state from a checkpoint (the weights are loaded
        before the model is wrapped). Returns why the optimizer starts fresh, if it does."""
        optimizer = payload.get("optimizer")
        if self.scheduler is not None and payload.get("scheduler"):
            self.scheduler.load_state_dict(payload["scheduler"])
        if self.precision.scaler is not None and payload.get("scaler"):
            self.precision.scaler.load_state_dict(payload["scaler"])
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
            optimizer = optimizer_state_by_index(optimizer, self.module, self.optimizer)
        self.optimizer.load_state_dict(optimizer)


#: Every backend class that names itself, by name, in the order they were defined;
#: backends/registry.py orders them for listing (the only reader).
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
    #: Where `check`, `--help` and error messages list it (simplest first; 0 is the default).
    list_position: ClassVar[int]
    #: The pip extra that installs the engine, if it is not torch itself.
    extra: ClassVar[str | None] = None
    #: How to start N processes with this backend (for messages and docs).
    launch_hint: ClassVar[str] = ""
    #: True when --batch_size is the global batch split over ranks; False: per worker.
    batch_size_is_global: ClassVar[bool] = True
    #: True when its engine keeps optimizer state in its own checkpoint format (a resumed
    #: run then reads that directory as it is instead of consolidating it)
    has_native_checkpoint: ClassVar[bool] = False
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

    # -- waiting for the other ranks (DESIGN.md, "No silent hangs") ----------------------

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

    def average(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Mean of `tensor` over ranks (float32; no host synchronisation)."""
        if self.world_size == 1:
            return tensor.detach().float()
        with self.waiting(name):
            return self._average(tensor, name)

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
                outcome["error"] = _portable(exc)
        outcome = self.broadcast_object(outcome, name)
        if outcome["error"] is not None:
            raise _rebuilt(outcome["error"], None, quiet=not self.is_root)
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
            result, error = None, _portable(exc)
        errors = self.all_gather_object(error, name)
        failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
        if failed:
            rank, first = failed[0]
            raise _rebuilt(first, rank if len(failed) < len(errors) else None)
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

    def precision(self) -> Precision:
        return Precision(self.precision_name, self.device, self.use_apex)

    # -- the engine --------------------------------------------------------------------

    @abstractmethod
    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None) -> Engine:
        """Wrap `module` for this backend and build its optimizer and scheduler.

        shard_units: submodules a sharding backend (FSDP) may shard one by one; a list
            is one unit of several modules (blocks that share a module).
        clip_grad_norm: for engines that clip inside their step (DeepSpeed).
        """


def _portable(exc: DalleDistError | Stopped) -> tuple[str, str, int]:
    """An error as plain data (class name, message, exit status), to send to other ranks."""
    return type(exc).__name__, str(exc), getattr(exc, "exit_status", 0)


def _rebuilt(error: tuple[str, str, int], rank: int | None, quiet: bool = False
             ) -> DalleDistError | Stopped:
    """The error again; a stop's message is the root's alone to print (quiet elsewhere)."""
    kind, message, status = error
    if kind == "Stopped":
        return Stopped("" if quiet else message)
    rebuilt = DalleDistError(f"rank {rank}: {message}" if rank is not None else message)
    rebuilt.exit_status = status
    return rebuilt
