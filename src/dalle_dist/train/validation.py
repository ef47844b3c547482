"""The validation loss on the held-out part (--val_fraction), measured by every rank on
its share and averaged over all held-out samples in one all-reduce.

It is a sync point of its own, taken only at its cadence (--val_every_n_steps, each
epoch end); the training steps between stay free of host synchronisation. It runs in a
forked RNG with the model in eval mode, so measuring it (or how often) changes nothing
training sees: a run with validation trains the same weights as one without. Inside the
fork every pass starts from one seed, so a model that draws in its forward (the VAE's
Gumbel noise) draws the same noise at every measurement: fixed weights give a fixed
validation loss, and the curve moves only with the weights.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.data.heldout import WeightedBatch
from dalle_dist.model.modes import eval_mode
from dalle_dist.train.task import Task

#: What every validation pass seeds its forked RNG with (see the module docstring).
VALIDATION_SEED = 0


def seed_pass(device: torch.device) -> None:
    """Seed the streams fork_rng forked, and only those: the CPU's and, on CUDA, the
    run's device's (torch.manual_seed would also reseed every other visible GPU)."""
    torch.random.default_generator.manual_seed(VALIDATION_SEED)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(VALIDATION_SEED)


class HeldOut(Protocol):
    """What a loader's `held_out` offers (data.heldout.HeldOutLoader, WebDatasetHeldOut)."""

    samples: int

    def __len__(self) -> int: ...
    def batches(self) -> Any: ...
    def first_batch(self) -> Any: ...


@torch.no_grad()
def held_out_sums(task: Task, engine: Engine, device: torch.device,
                  batches: Any) -> torch.Tensor:
    """[sum of mean loss x real samples, real samples] over this rank's weighted batches,
    on the device (no value read back here). The samples are counted on the host (each
    batch's weight is a Python int) and the count filled in on the device once, at the
    end: no host-to-device copy per batch."""
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    samples = 0
    for batch, n in batches:
        loss = engine.forward(*task.inputs(batch, device, training=False))["loss"]
        loss_sum += loss.detach().float() * n
        samples += n
    return torch.stack([loss_sum, torch.full((), float(samples), device=device)])


def validation_loss(task: Task, engine: Engine, backend: DistributedBackend,
                    held_out: HeldOut) -> float:
    """The mean loss over every held-out sample of every rank, with the EMA weights where
    the engine keeps them (--ema_decay); collective."""
    device = backend.device
    module = engine.module
    with (torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
          eval_mode(module), engine.ema_applied()):
        seed_pass(device)
        with backend.waiting("the validation pass"):
            sums = held_out_sums(task, engine, device, held_out.batches())
    # One all-reduce for the pass; the mean of the ranks' sums keeps their ratio.
    total, count = backend.average_to_host(sums, "the validation loss all-reduce")
    return total / max(count, 1e-12)


def validation_due(every_n_steps: int, step: int, epoch_done: bool) -> bool:
    """At each epoch end, and every N optimizer steps when N > 0."""
    return epoch_done or (bool(every_n_steps) and step % every_n_steps == 0)


__all__ = ["VALIDATION_SEED", "HeldOut", "WeightedBatch", "held_out_sums", "seed_pass",
           "validation_due", "validation_loss"]
