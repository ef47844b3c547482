"""--ema_decay: an exponential moving average of the trained weights, kept by the engine
beside the values it averages (docs/design.md, "EMA weights").

Each rank keeps fp32 copies of exactly the parameter values it holds: the whole tensors
on replicas (one process, DDP, Horovod, ZeRO 0-2), its own shards under FSDP2 (each
DTensor's local part) and ZeRO-3 (each parameter's `ds_tensor` partition). So the EMA
costs 4 bytes per parameter, divided over the ranks as the parameters are, and an update
is elementwise on the rank's own values: no communication, no host synchronisation (one
foreach lerp after the optimizer step; the step number it is decided on is a host int).

Outside the update the EMA is seen as DTensors of the parameters' global shapes where it
is sharded, so a checkpoint gathers it with `full_tensor()` and DCP saves it and reshards
it to another world size as it does the parameters. A ZeRO-3 partition is a slice of the
flattened parameter, torch.chunk's split of it (DeepSpeed pads each to ceil(numel /
world)), which is DTensor's Shard(0) of the flat parameter: an engine whose layout is
`flat` presents every entry flattened, replicas included, so its saves read the same at
every ZeRO stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dalle_dist.backends.placement import rank_chunk


@dataclass(frozen=True)
class EMASettings:
    """--ema_decay D, --ema_start_step S, --ema_every K: after optimizer step n (1, 2, ...)
    the EMA is the weights themselves while n <= S, then every K-th step moves towards
    them: ema = D * ema + (1 - D) * weights."""

    decay: float
    start_step: int = 0
    every: int = 1

    def updates_at(self, step: int) -> str | None:
        """What step `step` does to the EMA: "copy", "average" or nothing (None)."""
        if step <= self.start_step:
            return "copy"
        return "average" if (step - self.start_step) % self.every == 0 else None


@dataclass(frozen=True)
class EMAEntry:
    """One averaged parameter: its name, its whole shape, and where it is sharded the
    DeviceMesh and placements of the DTensor its local part belongs to (None: whole on
    every rank). `flat`: the DTensor is of the flattened parameter (ZeRO-3's partitions)."""

    name: str
    shape: torch.Size
    mesh: Any = None
    placements: tuple[Any, ...] | None = None
    flat: bool = False

    def global_shape(self) -> torch.Size:
        return torch.Size([self.shape.numel()]) if self.flat else self.shape


class EMA:
    """The EMA of one engine's parameters. `sources()` returns, in `entries`' order, the
    tensors this rank holds of each parameter now (fetched at every use: an engine may
    replace a parameter's storage, never its values' meaning)."""

    def __init__(self, settings: EMASettings, entries: list[EMAEntry],
                 sources: Callable[[], list[torch.Tensor]]) -> None:
        self.settings, self.entries, self._sources = settings, entries, sources
        self.shadow = [s.detach().to(torch.float32, copy=True) for s in sources()]

    def _fp32_sources(self) -> list[torch.Tensor]:
        return [s.detach() if s.dtype == torch.float32 else s.detach().float()
                for s in self._sources()]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step `step`: copy or average as the settings say (device work
        only)."""
        action = self.settings.updates_at(step)
        if action == "copy":
            torch._foreach_copy_(self.shadow, self._fp32_sources())
        elif action == "average":
            torch._foreach_lerp_(self.shadow, self._fp32_sources(),
                                 1.0 - self.settings.decay)

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The EMA in the parameters' place inside (a sample grid, a validation pass),
        the trained values back after it, bit for bit (kept in their own dtype)."""
        sources = self._sources()
        kept = [s.detach().clone() for s in sources]
        torch._foreach_copy_([s.detach() for s in sources], self.shadow)
        try:
            yield
        finally:
            torch._foreach_copy_([s.detach() for s in self._sources()], kept)

    # -- state -----------------------------------------------------------------------

    def as_global(self, entry: EMAEntry, local: torch.Tensor) -> torch.Tensor:
        """`local` as the tensor a checkpoint sees: a DTensor of the global shape where
        sharded, flattened for a flat layout."""
        if entry.mesh is None:
            return local.view(-1) if entry.flat else local
        from torch.distributed.tensor import DTensor

        shape = entry.global_shape()
        return DTensor.from_local(local.view(-1) if entry.flat else local, entry.mesh,
                                  entry.placements, run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())

    def sharded_state(self) -> dict[str, torch.Tensor]:
        """Name -> this rank's EMA as DCP saves and loads it (in place: views of it)."""
        return {e.name: self.as_global(e, s) for e, s in zip(self.entries, self.shadow,
                                                            strict=True)}

    def load_sharded_state(self, state: dict[str, torch.Tensor]) -> None:
        """sharded_state's dict, filled by DCP, into the EMA (a no-op where DCP wrote
        into its views; a copy where it replaced a tensor)."""
        for entry, shadow in zip(self.entries, self.shadow, strict=True):
            value = state[entry.name]
            local = value.to_local() if hasattr(value, "to_local") else value
            if local.data_ptr() != shadow.data_ptr():
                shadow.copy_(local.view(shadow.shape))

    @torch.no_grad()
    def full_state(self, is_root: bool) -> dict[str, torch.Tensor] | None:
        """Every parameter's whole EMA in fp32 on the CPU of the root (None elsewhere),
        gathered one parameter at a time. Collective when sharded."""
        out: dict[str, torch.Tensor] = {}
        for entry, shadow in zip(self.entries, self.shadow, strict=True):
            value = self.as_global(entry, shadow)
            if entry.mesh is not None:
                value = value.full_tensor()
            if is_root:
                out[entry.name] = value.detach().reshape(entry.shape).cpu().clone()
        return out if is_root else None

    @torch.no_grad()
    def load_full_state(self, weights: dict[str, torch.Tensor]) -> list[str]:
        """Whole EMA tensors (a single file's `ema_weights`, every rank holding them)
        into this rank's parts. Returns the names missing from `weights` (left as they
        were: the weights they started from)."""
        missing = []
        for entry, shadow in zip(self.entries, self.shadow, strict=True):
            full = weights.get(entry.name)
            if full is None:
                missing.append(entry.name)
                continue
            full = full.detach().to(torch.float32).reshape(entry.global_shape())
            if entry.mesh is not None:
                full = rank_chunk(full, entry.mesh.get_local_rank(), entry.mesh.size())
            shadow.copy_(full.reshape(shadow.shape))
        return missing


def with_ema(model: nn.Module, weights: dict[str, torch.Tensor],
             ema: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict of `model` (`weights`, with every name and the buffers) whose
    parameters are the EMA's. The EMA holds each parameter once, under its first name: a
    module shared by several layers gets the EMA under every name it has, or
    load_state_dict would assign it whichever copy comes last."""
    merged = {**weights, **ema}
    for names in shared_names(model):
        source = next((name for name in names if name in ema), None)
        for name in names if source is not None else ():
            merged[name] = ema[source]
    return merged


def shared_names(model: nn.Module) -> list[list[str]]:
    """state_dict names that are one tensor in `model` (a module shared by several layers
    appears under each layer's name), in groups of two or more."""
    groups: dict[int, list[str]] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(key)
    return [names for names in groups.values() if len(names) > 1]
