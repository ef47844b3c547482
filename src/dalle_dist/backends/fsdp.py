"""`fsdp`: FSDP2 (`fully_shard`) per shard unit (transformer block) and on the root module,
applied the way torchtitan applies it.

No rank ever holds the whole model: a training run's DALL-E arrives built on the meta
device with a stream of its values (docs/design.md, "Construction"); it is sharded as it
is, each rank allocates only its own shards (`to_empty`) and fills each from its chunk of
the full value, one parameter at a time. A module built with values (the VAE) is first
turned into that skeleton. The values come from identical seeding or the same checkpoint
file on every rank, not from a broadcast, so one gather of a digest per rank checks that
they agree: a rank that drew different weights would otherwise train a shard of a
different model, which the per-rank shard digests at the end cannot show.

bf16 and fp16 gather parameters in that dtype and reduce gradients in fp32
(`MixedPrecisionPolicy`, on every `fully_shard` call). Autocast stays on as on the other
backends: the policy decides what the all-gather moves, autocast decides which ops run in
fp32 (softmax, layer norm and the loss, computed inside our models' forward; torchtitan
can rely on the policy alone because its models upcast there themselves).

fp16's found-inf: the ranks hold different gradient shards. torch's GradScaler unscales
DTensor gradients through DTensor's `found_inf_reduce_handler`, which all-reduces found-inf
with MAX over the mesh, so every rank skips the same steps (tests/backends/
test_fp16_agreement.py proves it with an inf in one rank's gradient).

Parameters become sharded DTensors, so the optimizer is built after sharding. Checkpoints
are sharded by default (each rank saves its own DTensor shards through DCP:
checkpoint/sharded_dir.py); --checkpoint_format full gathers the full state on rank 0
(torch.distributed.checkpoint.state_dict).

FSDP2 and torch.distributed.checkpoint are imported where they are used: importing them
costs about a second of CPU, which every `dalle-dist` process paid at start-up when this
module (registered with every backend) imported them at the top.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from dalle_dist.backends.ema import EMAEntry
from dalle_dist.backends.engine import Engine, OptimizerFactory, SchedulerFactory, parameter_digest
from dalle_dist.backends.placement import rank_chunk
from dalle_dist.backends.plan_terms import PlanTerms
from dalle_dist.backends.precision import Precision
from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.backends.torch_dist import TorchDistributedBackend
from dalle_dist.model.init import WeightStream, with_heads

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.fsdp import MixedPrecisionPolicy


def _full_on_root() -> StateDictOptions:
    """Whole tensors, gathered to the CPU of rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def mixed_precision_policy(precision_name: str) -> MixedPrecisionPolicy:
    """Gather parameters in the precision's dtype (fp32 when it has none), reduce gradients
    in fp32: summing over ranks in bf16 would lose the low bits of every gradient."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = PRECISION_KINDS[precision_name].dtype
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard_onto(module: nn.Module, units: Sequence[nn.Module | list[nn.Module]],
               device: torch.device, policy: MixedPrecisionPolicy, rank: int,
               world_size: int, weights: WeightStream | None = None) -> dict[str, bytes]:
    """Shard `module` over `world_size` ranks on `device`, in place: each rank allocates
    and fills only its own shards. Returns the first elements of each full value, for the
    ranks to compare (model.init.with_heads).

    A meta-built module (weights: its values, one full parameter at a time) is sharded as
    it is, so no rank ever holds the whole model: the host holds one full parameter at a
    time, the device this rank's shards. A built module (weights None; a VAE, or a test's
    model) keeps its tensors aside and goes to the meta device first. Then `fully_shard`
    splits the skeleton, `to_empty` allocates this rank's shards on the device, and each is
    filled with its chunk of the full value (only that chunk crosses to the device).
    Buffers are not sharded: each rank gets its copy back. A unit given as a list is one
    `fully_shard([...])` group: modules that share parameters.
    """
    buffers = {name: buffer.detach() for name, buffer in module.named_buffers()}
    if weights is None:
        weights = iter([(name, param.detach()) for name, param in module.named_parameters()])
        module.to("meta")
    elif buffers:
        raise ValueError("a meta-built module cannot have buffers: they would have no values")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(device.type, (world_size,))
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    for method in getattr(module, "forward_methods", ()):  # sampling's entry points
        register_fsdp_forward_method(module, method)
    module.to_empty(device=device)
    params: dict[str, nn.Parameter] = dict(module.named_parameters())
    heads: dict[str, bytes] = {}
    with torch.no_grad():
        for name, full in with_heads(weights, heads):
            local, chunk = params.pop(name).to_local(), rank_chunk(full, rank, world_size)
            if local.shape != chunk.shape:  # FSDP2 split differently from torch.chunk
                raise RuntimeError(f"{name}: shard {tuple(local.shape)} on rank {rank}, "
                                   f"expected {tuple(chunk.shape)}")
            local.copy_(chunk)
        for name, buffer in module.named_buffers():
            buffer.copy_(buffers[name])
    if params:
        raise RuntimeError(f"no value for {sorted(params)[:5]}")
    return heads


class FSDPEngine(Engine):
    shards_parameters: ClassVar[bool] = True
    samples_sharded: ClassVar[bool] = True

    def end_sampling(self) -> None:
        """The root unit's weights stay gathered after its forward (FSDP2 keeps them for
        the backward that follows in training); after sampling, nothing follows."""
        self.module.reshard()

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.module, options=_full_on_root())
        return state if self.is_root else None

    def optimizer_state_dict(self) -> dict[str, Any] | None:
        if not self.optimizer.state:  # see Engine.optimizer_state_dict
            return None
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = get_optimizer_state_dict(self.module, self.optimizer, options=_full_on_root())
        return state if self.is_root else None

    def rank_digest(self) -> str:
        """This rank's own shards: gathering first would make every rank's hash equal by
        construction (and hold the whole model on every rank)."""
        return parameter_digest({name: param.to_local()
                                 for name, param in self.module.named_parameters()})

    def _ema_layout(self) -> tuple[list[EMAEntry], Any]:
        """Each rank averages its own shards: the local part of every DTensor parameter,
        presented as a DTensor of the same mesh and placements."""
        named = list(self.module.named_parameters())
        entries = [EMAEntry(name, p.shape, p.device_mesh, tuple(p.placements))
                   for name, p in named]
        params = [p for _, p in named]
        return entries, lambda: [p.to_local() for p in params]

    def _gradient_sync(self, sync: bool) -> AbstractContextManager[None]:
        """FSDP2 reduce-scatters in backward unless told not to; the flag reaches every
        fully_shard unit below the root. Set on every micro-batch (True on the last), so a
        window never leaves it off."""
        self.module.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def _load_optimizer(self, optimizer: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        # Every rank read the file: each takes its own shard of the full state.
        set_optimizer_state_dict(
            self.module, self.optimizer, optimizer,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))


class FSDPBackend(TorchDistributedBackend):
    name = "fsdp"
    default_checkpoint_format = "sharded"  # no rank gathers the whole model to save
    plan_terms = PlanTerms("FSDP", cost_rank=(6,), sharding="fully_shard")

    def distribute(self, module: nn.Module, make_optimizer: OptimizerFactory,
                   make_scheduler: SchedulerFactory,
                   shard_units: Sequence[nn.Module | list[nn.Module]] = (),
                   clip_grad_norm: float | None = None,
                   weights: WeightStream | None = None) -> Engine:
        """weights: the values of a meta-built `module`, which each rank then fills shard
        by shard; None: `module` holds its values (see shard_onto)."""
        device = self.device
        heads = shard_onto(module, shard_units, device,
                           mixed_precision_policy(self.precision_name), self.rank,
                           self.world_size, weights)
        self.check_same_weights(heads)
        optimizer = make_optimizer(module.parameters())
        # Apex amp cannot wrap a sharded model: FSDP always uses native autocast.
        return FSDPEngine(module, optimizer, make_scheduler(optimizer),
                          Precision(self.precision_name, device), is_root=self.is_root,
                          watch=self.watch, ga_steps=self.ga_steps)
