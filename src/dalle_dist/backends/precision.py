"""Numeric precision of training: fp32, or bf16 / fp16 autocast (fp16 with loss scaling).

DeepSpeed does its own mixed precision from its config; every other backend uses these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Autocast context and gradient scaler for one precision on one device."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name, self.device = name, device
        self.dtype = _DTYPES[name]
        # fp16 gradients underflow without scaling; bf16 has fp32's range and needs none.
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield
