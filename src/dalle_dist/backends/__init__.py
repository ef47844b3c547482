"""Distributed backends behind one contract (DESIGN.md, "Backends")."""

from dalle_dist.backends.base import DistributedBackend, Engine
from dalle_dist.backends.registry import BACKENDS, add_backend_arguments, backend_from_args
from dalle_dist.backends.single import SingleBackend

__all__ = [
    "BACKENDS",
    "DistributedBackend",
    "Engine",
    "SingleBackend",
    "add_backend_arguments",
    "backend_from_args",
]
