"""The engine a backend hands the training loop: a model with its optimizer and scheduler,
driven through one interface whatever wraps it (docs/design.md, "Backends").

This base runs the model as it is; each backend's subclass wraps DDP, FSDP, DeepSpeed or
Horovod behind the same methods. Nothing here knows about DALL-E: the model is an
nn.Module, and optimizers and schedulers arrive built, from the factories a backend calls
once it has wrapped or sharded the parameters.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from dalle_dist.backends.ema import EMA, EMAEntry, EMASettings, with_ema
from dalle_dist.backends.optim_state import optimizer_state_by_index
from dalle_dist.backends.precision import Precision
from dalle_dist.backends.watch import CollectiveWatch

#: What builds the optimizer, from the parameters as the backend wrapped or sharded them.
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
#: What builds the scheduler, from the optimizer.
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
    #: True when every rank samples through its own shards, together (FSDP2: a unit's
    #: weights are gathered for its call and freed after it), so a sample grid never
    #: puts the whole model on one rank; False: the root samples from the whole model.
    samples_sharded: ClassVar[bool] = False
    #: --ema_decay's moving average of the parameters this rank holds (start_ema); None
    #: without it
    ema: EMA | None = None

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

    def end_sampling(self) -> None:
        """After a sample grid drawn through the shards (samples_sharded): free what the
        sampling calls left gathered. Nothing to free here."""

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

    # -- EMA ---------------------------------------------------------------------------

    def start_ema(self, settings: EMASettings) -> None:
        """An EMA of the parameters as they are now (after a checkpoint's weights were
        loaded), kept on this engine; a checkpoint's own EMA replaces it on resume."""
        self.ema = EMA(settings, *self._ema_layout())

    #: whether ema_applied puts the EMA in the parameters' place (DeepSpeed ZeRO-3 does
    #: not: its inference copies take it from inference_state_dict instead)
    ema_swaps: bool = True

    def ema_applied(self) -> AbstractContextManager[None]:
        """The EMA in the parameters' place inside (sampling, validation), where the
        engine keeps one and can swap it in (ema_swaps); the trained weights as they are
        otherwise."""
        if self.ema is None or not self.ema_swaps:
            return contextlib.nullcontext()
        return self.ema.applied()

    def inference_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """full_state_dict for an inference copy `model` of the module (on the root; None
        elsewhere), with the EMA's values where the engine keeps one that ema_applied
        cannot swap in. Collective if sharded."""
        state = self.full_state_dict()
        if self.ema is None or self.ema_swaps:
            return state
        ema = self.ema.full_state(self.is_root)
        return None if state is None or ema is None else with_ema(model, state, ema)

    def _ema_layout(self) -> tuple[list[EMAEntry], Any]:
        """What the EMA averages: one entry per parameter (shared ones once) and the
        callable returning this rank's tensor of each. Here every rank holds the whole
        parameters (one process, replicas)."""
        named = list(self.module.named_parameters())
        entries = [EMAEntry(name, p.shape) for name, p in named]
        params = [p for _, p in named]
        return entries, lambda: params

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

    def sharded_state(self, with_optimizer: bool = True, with_ema: bool = True
                      ) -> dict[str, Any]:
        """The model's and optimizer's state in torch.distributed.checkpoint's form, keyed
        by parameter name: this rank's own shards under FSDP (DTensors), the whole tensors
        on replicas (DCP writes each replicated tensor once). DCP saves it from every rank
        at once, and loads it back resharded to this run's ranks.

        with_optimizer: include the optimizer. Before the first step it has no state:
        a save leaves it out then; to load into, torch first creates it (a zero-gradient
        step at learning rate 0, which moves no weight), so DCP has tensors to fill.
        with_ema: include the EMA (`ema`, as its sharded_state: shards where sharded),
        when the engine keeps one.
        """
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        state: dict[str, Any] = {"model": get_model_state_dict(self.module)}
        if with_optimizer:
            state["optim"] = get_optimizer_state_dict(self.module, self.optimizer)
        if with_ema and self.ema is not None:
            state["ema"] = self.ema.sharded_state()
        return state

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """sharded_state's dict, filled by DCP, back into the model and optimizer."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        set_model_state_dict(self.module, state["model"])
        if "optim" in state:
            set_optimizer_state_dict(self.module, self.optimizer, state["optim"])
        if "ema" in state and self.ema is not None:
            self.ema.load_sharded_state(state["ema"])

    def save_native(self, directory: Path, tag: str, client_state: dict[str, Any]) -> None:
        """Every rank writes its part of the engine's own checkpoint as `directory/tag`."""
        raise NotImplementedError(f"{type(self).__name__} has no checkpoint format of its own")

    def load_native(self, directory: Path, tag: str, universal: bool = False) -> bool:
        """Load `directory/tag` of the engine's own format; False when the engine could not.
        universal: the tag is a universal checkpoint (DeepSpeed's, of another world size)."""
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
