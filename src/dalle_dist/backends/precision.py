"""Numeric precision of training: fp32, or bf16 / fp16 autocast (fp16 with loss scaling).

DeepSpeed's engine does its mixed precision from its config (backends/deepspeed.py); every
other backend uses these.
DALLE-pytorch's --amp meant NVIDIA Apex's amp at O1: it is used when a real Apex with
`apex.amp` imports on CUDA, and native fp16 autocast otherwise, with one line saying why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dalle_dist.backends.precision_kinds import PRECISION_KINDS


def apex_amp(device: torch.device) -> tuple[Any | None, str]:
    """(apex.amp, "") when --amp can use NVIDIA Apex here, else (None, why not)."""
    fallback = "using torch.autocast fp16 with a gradient scaler instead"
    if device.type != "cuda":
        return None, f"--amp: Apex amp needs CUDA and this run is on {device.type}; {fallback}"
    try:
        from apex import amp
    except ImportError:
        return None, ("--amp: NVIDIA Apex with apex.amp is not importable (apex.amp was "
                      "removed upstream, and the PyPI package named apex is unrelated); "
                      f"{fallback}")
    return amp, ""


class Precision:
    """Autocast context and loss scaling for one precision on one device."""

    def __init__(self, name: str, device: torch.device, use_apex: bool = False) -> None:
        kind = PRECISION_KINDS[name]
        self.name, self.device, self.dtype = name, device, kind.dtype
        self.apex = apex_amp(device)[0] if use_apex else None
        self.scaler = (torch.amp.GradScaler(device.type)
                       if kind.loss_scaled and self.apex is None else None)

    def prepare(self, module: nn.Module, optimizer: torch.optim.Optimizer
                ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Apex wraps model and optimizer itself (before DDP); native precision does not."""
        if self.apex is None:
            return module, optimizer
        return self.apex.initialize(module, optimizer, opt_level="O1")

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None or self.apex is not None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        if self.apex is not None:
            with self.apex.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        elif self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()


#: The layers whose output dtype shows the precision a step really computed in.
_MATMUL_LAYERS = (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)


@contextlib.contextmanager
def matmul_dtypes(module: nn.Module) -> Iterator[set[torch.dtype]]:
    """The dtypes the module's linear and conv layers produced while inside.

    Metadata only (no device sync). The loop watches its first step with it and logs the
    answer, so a precision flag that was silently dropped (autocast never entered, a
    DeepSpeed torch_autocast or fp16 section left disabled) shows as float32 in the log.
    """
    seen: set[torch.dtype] = set()

    def record(_layer: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            seen.add(output.dtype)

    handles = [layer.register_forward_hook(record)
               for layer in module.modules() if isinstance(layer, _MATMUL_LAYERS)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def dtype_names(dtypes: set[torch.dtype]) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes)) or "none seen"
