"""The backends by name, and choosing one from the flags (DESIGN.md, "Backends").

Each backend class registers itself by naming itself (DistributedBackend.__init_subclass__)
and declares its extra, launch hint, verdict and plan terms; importing the modules below is
what registers them. Everything that lists backends reads BACKENDS; precisions are
backends/precision.py's PRECISION_KINDS.
"""

from __future__ import annotations

import argparse

import torch

# Imported to register the backends (DeepSpeed by name: --deepspeed resolves to it).
from dalle_dist.backends import fsdp, horovod, single, torch_ddp  # noqa: F401
from dalle_dist.backends.base import REGISTERED, DistributedBackend
from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.deepspeed import DeepSpeedBackend
from dalle_dist.backends.precision import PRECISION_KINDS
from dalle_dist.backends.verdict import Verdict
from dalle_dist.backends.watch import DEFAULT_TIMEOUT_S
from dalle_dist.config_base import add_flags
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
    """The flags that choose and configure a backend (DistributedConfig's), DALLE-pytorch's
    names kept."""
    add_flags(parser, DistributedConfig, exclude=["device"],
              help={"backend": f"one of {', '.join(BACKENDS)}"})
    # Launchers pass --local_rank=N; the deepspeed launcher puts it before the subcommand,
    # where the top-level parser takes it. SUPPRESS keeps this copy from overwriting it.
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int,
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def backend_name(config: DistributedConfig) -> str:
    """--distributed_backend, or deepspeed for DALLE-pytorch's --deepspeed."""
    name = config.backend
    if config.deepspeed:
        if name not in (None, DeepSpeedBackend.name):
            raise ConfigError(f"--deepspeed contradicts --distributed_backend {name}",
                              "drop one of the two")
        name = DeepSpeedBackend.name
    return name or DEFAULT_BACKEND


def backend_from_config(config: DistributedConfig) -> DistributedBackend:
    """The backend the config names, checked: known, not contradicted, and installed."""
    name = backend_name(config)
    if not config.collective_timeout > 0:
        raise ConfigError(f"--collective_timeout must be positive, got "
                          f"{config.collective_timeout:g}",
                          f"give a number of seconds; the default is {DEFAULT_TIMEOUT_S:.0f}")
    if name not in BACKENDS:
        raise ConfigError(f"unknown --distributed_backend {name!r}",
                          f"known backends: {', '.join(BACKENDS)}")
    # The verdicts `dalle-dist check` prints, before any process group is joined.
    verdict = backend_verdict(name)
    if not verdict.usable:
        raise ConfigError(f"backend {name} cannot run here: {verdict.reason}",
                          f"{verdict.fix}, then see dalle-dist check --backend {name}")
    device = config.device
    cuda = device.startswith("cuda") if device else torch.cuda.is_available()
    verdict = precision_verdict(name, config.precision_name, cuda)
    if not verdict.usable:
        raise ConfigError(verdict.reason, verdict.fix)
    return BACKENDS[name](config)
