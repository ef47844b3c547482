"""Distributed backends behind one contract (docs/design.md, "Backends").

The names below load on first use (PEP 562), so importing a light module of this package
(catalog, precision_kinds: what parsers need) imports neither torch nor any engine.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of this package that defines it
_EXPORTS = {
    "BACKENDS": "registry",
    "DistributedBackend": "contract",
    "DistributedConfig": "config",
    "Engine": "engine",
    "SingleBackend": "single",
    "add_backend_arguments": "registry",
    "backend_from_config": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
