"""The backends by name, and choosing one from the flags (DESIGN.md, "Backends").

Each backend class registers itself by naming itself (DistributedBackend.__init_subclass__)
and declares its extra, launch hint, verdict and plan terms; importing the modules below is
what registers them. Everything that lists backends reads BACKENDS; precisions are
backends/precision.py's PRECISION_KINDS.
"""

from __future__ import annotations

import argparse

import torch

# Imported to register the backends (and DeepSpeed's for its --deepspeed flag).
from dalle_dist.backends import fsdp, horovod, single, torch_ddp  # noqa: F401
from dalle_dist.backends.base import REGISTERED, DistributedBackend
from dalle_dist.backends.deepspeed import DeepSpeedBackend
from dalle_dist.backends.precision import (
    AMP_PRECISION,
    DEFAULT_PRECISION,
    PRECISION_KINDS,
    PRECISIONS,
)
from dalle_dist.backends.verdict import Verdict
from dalle_dist.backends.watch import DEFAULT_TIMEOUT_S
from dalle_dist.errors import ConfigError

#: Every backend, by name, in the order `check`, `--help` and errors list them.
BACKENDS: dict[str, type[DistributedBackend]] = dict(
    sorted(REGISTERED.items(), key=lambda item: item[1].list_position))
DEFAULT_BACKEND = next(iter(BACKENDS))


def backend_verdict(name: str, cuda: bool | None = None) -> Verdict:
    """Can backend `name` start here (on CUDA when `cuda`; default: when torch sees one)?"""
    return BACKENDS[name].verdict(torch.cuda.is_available() if cuda is None else cuda)


def precision_verdict(backend: str, precision: str, cuda: bool | None = None) -> Verdict:
    """Can backend `backend` train in `precision` here?"""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return BACKENDS[backend].precision_verdict(PRECISION_KINDS[precision], cuda)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose and configure a backend, DALLE-pytorch's names kept."""
    group = parser.add_argument_group("distributed backend")
    group.add_argument("--distributed_backend", "--distr_backend", dest="distributed_backend",
                       default=None, metavar="NAME",
                       help=f"one of {', '.join(BACKENDS)} (default: single)")
    group.add_argument("--deepspeed", action="store_true",
                       help="use the deepspeed backend (as DALLE-pytorch's --deepspeed)")
    group.add_argument("--precision", choices=PRECISIONS, default="fp32",
                       help="default %(default)s")
    group.add_argument("--fp16", action="store_const", const="fp16", dest="precision",
                       help="same as --precision fp16")
    group.add_argument("--collective_timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       metavar="SECONDS",
                       help="how long a rank waits for the others (a step's all-reduce, a "
                            "checkpoint save, the built-in VAE) before the run ends with an "
                            "error naming the wait; raise it when saving a huge model to a "
                            "slow disk takes longer (default %(default).0f: 30 minutes)")
    group.add_argument("--amp", action="store_true",
                       help="fp16 through NVIDIA Apex amp (O1) when it imports on CUDA, else "
                            "torch autocast fp16; the log says which")
    # Launchers pass --local_rank=N; the deepspeed launcher puts it before the subcommand,
    # where the top-level parser takes it. SUPPRESS keeps this copy from overwriting it.
    group.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int,
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    for cls in BACKENDS.values():
        cls.add_arguments(parser)


def backend_from_args(args: argparse.Namespace) -> DistributedBackend:
    """The backend the flags name, checked: known, not contradicted, and installed."""
    name = args.distributed_backend
    if args.deepspeed:
        if name not in (None, DeepSpeedBackend.name):
            raise ConfigError(f"--deepspeed contradicts --distributed_backend {name}",
                              "drop one of the two")
        name = DeepSpeedBackend.name
    name = name or DEFAULT_BACKEND
    timeout = getattr(args, "collective_timeout", DEFAULT_TIMEOUT_S)
    if not timeout > 0:
        raise ConfigError(f"--collective_timeout must be positive, got {timeout:g}",
                          f"give a number of seconds; the default is {DEFAULT_TIMEOUT_S:.0f}")
    if name not in BACKENDS:
        raise ConfigError(f"unknown --distributed_backend {name!r}",
                          f"known backends: {', '.join(BACKENDS)}")
    # The verdicts `dalle-dist check` prints, before any process group is joined.
    verdict = backend_verdict(name)
    if not verdict.usable:
        raise ConfigError(f"backend {name} cannot run here: {verdict.reason}",
                          f"{verdict.fix}, then see dalle-dist check --backend {name}")
    device = getattr(args, "device", None)
    cuda = device.startswith("cuda") if device else torch.cuda.is_available()
    precision = (AMP_PRECISION if getattr(args, "amp", False) else
                 getattr(args, "precision", DEFAULT_PRECISION))
    verdict = precision_verdict(name, precision, cuda)
    if not verdict.usable:
        raise ConfigError(verdict.reason, verdict.fix)
    return BACKENDS[name](args)
