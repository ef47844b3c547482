"""The `--precision` choices by name, without importing torch.

Parsers and `dalle-dist check --help` list them before any engine is needed; the dtype of
a choice is looked up in torch only when something computes with it (backends/precision.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dalle_dist.backends.verdict import Verdict

if TYPE_CHECKING:
    import torch

#: bytes of one element of each autocast dtype (fp32's 4 without autocast)
_ITEMSIZE = {None: 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class PrecisionKind:
    """One `--precision` choice: its name, the autocast dtype's name in torch (None: fp32,
    no autocast) and whether it can train on this machine."""

    name: str
    dtype_name: str | None

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None: fp32, no autocast)."""
        if self.dtype_name is None:
            return None
        import torch

        return getattr(torch, self.dtype_name)

    @property
    def itemsize(self) -> int:
        """Bytes of one element it computes in (fp32's 4 without autocast)."""
        return _ITEMSIZE[self.dtype_name]

    @property
    def loss_scaled(self) -> bool:
        """fp16 gradients underflow without scaling; bf16 has fp32's range and needs none."""
        return self.dtype_name == "float16"

    def verdict(self, cuda: bool) -> Verdict:
        """Can it train here (on CUDA when `cuda`, else on CPU)? Backends may refuse more
        (DistributedBackend.precision_verdict)."""
        if self.dtype_name == "bfloat16" and cuda:
            import torch

            if not torch.cuda.is_bf16_supported():
                return Verdict(False, "this GPU has no bf16 (compute capability below 8.0)",
                               "use --precision fp16 (or fp32)")
        if self.dtype_name == "float16" and not cuda:
            return Verdict(True, "torch.autocast fp16 on CPU is slow; bf16 is the CPU choice")
        return Verdict(True)


#: Every precision, in the order `check`, `plan` and `--help` list them; the first is the
#: default.
PRECISION_KINDS: dict[str, PrecisionKind] = {kind.name: kind for kind in (
    PrecisionKind("fp32", None),
    PrecisionKind("bf16", "bfloat16"),
    PrecisionKind("fp16", "float16"),
)}
PRECISIONS: tuple[str, ...] = tuple(PRECISION_KINDS)
DEFAULT_PRECISION = PRECISIONS[0]
#: What --amp trains in (DALLE-pytorch's --amp: Apex O1, fp16).
AMP_PRECISION = "fp16"
