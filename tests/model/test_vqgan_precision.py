"""The VQGAN's nearest-code search runs its matmul at full fp32 precision even when the run
has TF32 on (training's default on CUDA), and hands the run its setting back.

TF32 itself needs a GPU; what our code controls is the process-wide precision setting each
matmul reads when it is launched, and that reads the same on a CPU build.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dalle_dist.model.vqgan import VectorQuantizer


class MatmulPrecisions(TorchFunctionMode):
    """Records the fp32 matmul precision in force at each matmul called inside."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if "matmul" in getattr(func, "__name__", ""):
            self.seen.append(torch.get_float32_matmul_precision())
        return func(*args, **(kwargs or {}))


@pytest.fixture
def tf32_run() -> Iterator[None]:
    """The process set as training sets it on CUDA (TF32 on), put back after."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(saved)


def test_code_distances_run_at_highest_precision_and_restore_the_run_setting(
        tf32_run: None) -> None:
    """Fails if indices() leaves the matmul to the run's TF32 (seen: "high" recorded), or
    does not put "high" back afterwards."""
    quantizer = VectorQuantizer(16, 4)
    z = torch.randn(2, 4, 3, 3)
    with MatmulPrecisions() as spy:
        codes = quantizer.indices(z)
    assert spy.seen == ["highest"]
    assert torch.get_float32_matmul_precision() == "high"
    # the codes are still the nearest entries
    flat = z.flatten(2).transpose(1, 2)
    nearest = torch.cdist(flat, quantizer.embedding.weight.detach().expand(2, -1, -1))
    assert torch.equal(codes, nearest.argmin(-1))
