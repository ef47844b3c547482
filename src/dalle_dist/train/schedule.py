"""The learning-rate schedules of `train` (--lr_schedule, --warmup_steps, --min_lr).

Warmup and decay are one closed-form function of the optimizer step, applied by one
LambdaLR: its whole state is the step count and the base rate, so a resumed run's rate
at every step is the uninterrupted run's by construction. (A chain of schedulers keeps
state in each link, and PyTorch's SequentialLR has had resume bugs there.) Steps are
optimizer steps: with --ga_steps N the schedule sees one step per N micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dalle_dist.train.config import OptimizerConfig

#: DALLE-pytorch's ReduceLROnPlateau (train_dalle.py --lr_decay)
PLATEAU = {"mode": "min", "factor": 0.5, "patience": 10, "cooldown": 10}


@dataclass(frozen=True)
class LRShape:
    """The rate after `step` optimizer steps, as a fraction of --learning_rate.

    Warmup: (step + 1) / warmup for the first `warmup` steps, so the first step already
    moves the weights and step `warmup` takes the full rate. Then cosine or linear from 1
    down to `floor` (--min_lr / --learning_rate) at the run's last step, `total`; constant
    stays at 1. (LambdaLR keeps this object's fields in its state dict, and a resumed run
    restores them: a rate schedule never changes mid-run.)
    """

    kind: str  # constant, cosine or linear
    warmup: int
    total: int
    floor: float

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total - self.warmup - 1)  # the last step reaches the floor
        progress = min(1.0, (step - self.warmup) / span)
        if self.kind == "cosine":
            fraction = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            fraction = 1.0 - progress
        return self.floor + (1.0 - self.floor) * fraction


def scheduled_per_step(optim: OptimizerConfig) -> bool:
    """Whether the scheduler steps after each optimizer step (else at epoch ends)."""
    return optim.lr_schedule != "plateau"


def make_lr_scheduler(optimizer: torch.optim.Optimizer, optim: OptimizerConfig,
                      learning_rate: float, total_steps: int | None) -> Any:
    """The scheduler of a resolved OptimizerConfig (OptimizerConfig.resolved) over a run of
    `total_steps` optimizer steps (needed by cosine and linear)."""
    if optim.lr_schedule == "constant" and not optim.warmup_steps:
        return None  # nothing to schedule
    if optim.lr_schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, min_lr=optim.min_lr,
                                                          **PLATEAU)
    if optim.lr_schedule != "constant" and total_steps is None:
        raise ValueError(f"--lr_schedule {optim.lr_schedule} needs the run's step count")
    floor = (optim.min_lr or 0.0) / learning_rate if learning_rate else 0.0
    shape = LRShape(str(optim.lr_schedule), optim.warmup_steps, total_steps or 0, floor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, shape)
