"""Shared behaviour of the typed config dataclasses: to and from plain dicts.

Checkpoints hold configs as plain dicts (loadable with torch.load(weights_only=True));
reading one back ignores keys this version does not know.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="DictConfig")


class DictConfig:
    """Mixin for frozen dataclasses; tuples become lists in the dict form."""

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in asdict(self).items()}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], values: dict[str, Any]) -> T:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in values.items() if k in known})
