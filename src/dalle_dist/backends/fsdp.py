"""`fsdp`: FSDP2 (`fully_shard`) per shard unit (transformer block) and on the root module.

Parameters become sharded DTensors, so the optimizer is built after sharding. Single-file
checkpoints gather the full state on rank 0 (torch.distributed.checkpoint.state_dict).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from dalle_dist.backends.base import Engine, OptimizerFactory, SchedulerFactory, parameter_digest
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision import Precision
from dalle_dist.backends.torch_dist import TorchDistributedBackend

_FULL_ON_ROOT = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPEngine(Engine):
    shards_parameters: ClassVar[bool] = True

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        state = get_model_state_dict(self.module, options=_FULL_ON_ROOT)
        return state if self.is_root else None

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        if not self.optimizer.state:  # see Engine.optimizer_state_dict
            return None
        state = get_optimizer_state_dict(self.module, self.optimizer, options=_FULL_ON_ROOT)
        return state if self.is_root else None

    def rank_digest(self) -> str:
        """This rank's own shards: gathering first would make every rank's hash equal by
        construction (and hold the whole model on every rank)."""
        return parameter_digest({name: param.to_local()
                                 for name, param in self.module.named_parameters()})

    def _gradient_sync(self, sync: bool) -> AbstractContextManager[None]:
        """FSDP2 reduce-scatters in backward unless told not to; the flag reaches every
        fully_shard unit below the root. Set on every micro-batch (True on the last), so a
        window never leaves it off."""
        self.module.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def _load_optimizer(self, optimizer: dict[str, Any]) -> None:
        # Every rank read the file: each takes its own shard of the full state.
        set_optimizer_state_dict(
            self.module, self.optimizer, optimizer,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))


class FSDPBackend(TorchDistributedBackend):
    name = "fsdp"
    list_position = 2
    plan_terms = PlanTerms("FSDP", cost_rank=(6,), sharding="fully_shard")

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory, shard_units: Sequence[nn.Module] = (),
                   clip_grad_norm: float | None = None) -> Engine:
        device = self.device
        module = module.to(device)
        # Rank 0's initial weights for everyone, as DDP does, before they are sharded.
        for tensor in [*module.parameters(), *module.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)
        for unit in shard_units:
            fully_shard(unit)
        fully_shard(module)
        optimizer = make_optimizer(module.parameters())
        # Apex amp cannot wrap a sharded model: FSDP always uses native autocast.
        return FSDPEngine(module, optimizer, make_scheduler(optimizer),
                          Precision(self.precision_name, device), is_root=self.is_root,
                          watch=self.watch, ga_steps=self.ga_steps)
