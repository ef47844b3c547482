"""Distributed backends behind one contract (DESIGN.md, "Backends")."""

from dalle_dist.backends.base import DistributedBackend, Engine
from dalle_dist.backends.single import SingleBackend

__all__ = ["DistributedBackend", "Engine", "SingleBackend"]
