"""The backends by name, and choosing one from the flags (docs/design.md, "Backends").

Each backend class registers itself by naming itself (DistributedBackend.__init_subclass__)
and declares its extra, launch hint, verdict and plan terms; importing the modules that
catalog.py names is what registers them. Everything that lists backends reads BACKENDS (or,
before torch is imported, catalog.BACKEND_NAMES); precisions are
backends/precision_kinds.py's PRECISION_KINDS.
"""

from __future__ import annotations

import argparse
import importlib

import torch

from dalle_dist.backends.catalog import BACKEND_MODULES, BACKEND_NAMES, DEFAULT_BACKEND
from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.contract import REGISTERED, DistributedBackend
from dalle_dist.backends.deepspeed import DeepSpeedBackend
from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.backends.verdict import Verdict
from dalle_dist.backends.watch import DEFAULT_TIMEOUT_S
from dalle_dist.config_base import add_flags
from dalle_dist.errors import ConfigError

for _module in BACKEND_MODULES.values():  # importing a backend's module registers it
    importlib.import_module(f"dalle_dist.backends.{_module}")
#: Every backend, by name, in the order `check`, `--help` and errors list them.
BACKENDS: dict[str, type[DistributedBackend]] = {name: REGISTERED[name] for name in BACKEND_NAMES}
assert set(BACKENDS) == set(REGISTERED), "a backend class missing from backends/catalog.py"


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
