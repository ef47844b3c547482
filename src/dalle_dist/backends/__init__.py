"""Distributed backends behind one contract (DESIGN.md, "Backends")."""

from dalle_dist.backends.base import DistributedBackend, Engine
from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.registry import BACKENDS, add_backend_arguments, backend_from_config
from dalle_dist.backends.single import SingleBackend

__all__ = [
    "BACKENDS",
    "DistributedBackend",
    "DistributedConfig",
    "Engine",
    "SingleBackend",
    "add_backend_arguments",
    "backend_from_config",
]
