"""model/kernels.py names the kernel each pattern's attention reaches, for `plan` and
`check`. The CUDA names follow SDPA's dispatch rules (no GPU here to observe them); the CPU
names are checked against the aten ops a layer actually runs.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dalle_dist.errors import ConfigError
from dalle_dist.model import attention_paths as paths
from dalle_dist.model.kernels import (
    BAND_MATMULS,
    DENSE_BIAS,
    FLASH,
    FLEX,
    MATH,
    MEMORY_EFFICIENT,
    attention_kernel,
)
from dalle_dist.model.patterns import PATTERNS, SequenceLayout
from tests.model.test_attention import DIM, make_layer, make_pattern

H100, T4 = (9, 0), (7, 5)
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
SMALL, LARGE = SequenceLayout(9, 8), SequenceLayout(9, 32)  # conv_like's auto: sdpa, gather


def kernel(name: str, dropout: float, dtype: torch.dtype = BF16,
           capability: tuple[int, int] | None = H100, impl: str = "auto",
           layout: SequenceLayout = LARGE, dim_head: int = 64) -> str:
    return attention_kernel(make_pattern(name, {}), layout, impl, dropout, dtype,
                            capability, dim_head)[1]


def test_cuda_kernels_per_pattern_dropout_and_dtype() -> None:
    """The table `plan` prints for a GPU. Without dropout every sparse pattern is on
    FlexAttention; with it (FlexAttention has none) the axial bands are on flash in 16
    bits, conv_like's band on the memory-efficient kernel, and sparse (and conv_like below
    auto's gather threshold) on the memory-efficient kernel with the n x n bias."""
    assert kernel("full", 0.0) == kernel("full", 0.1) == FLASH
    for name in ("axial_row", "axial_col", "conv_like", "sparse"):
        assert kernel(name, 0.0) == FLEX, name
    assert kernel("axial_row", 0.1) == kernel("axial_col", 0.1) == FLASH
    assert kernel("conv_like", 0.1) == MEMORY_EFFICIENT
    assert kernel("conv_like", 0.1, layout=SMALL) == DENSE_BIAS
    assert kernel("sparse", 0.1) == DENSE_BIAS
    # fp32, an older GPU, a wide head, fp64: flash's limits
    assert kernel("full", 0.1, FP32) == kernel("axial_row", 0.1, FP32) == MEMORY_EFFICIENT
    assert kernel("full", 0.0, FP16, T4) == MEMORY_EFFICIENT
    assert kernel("full", 0.0, BF16, T4) == MATH  # no bf16 below capability 8.0
    assert kernel("full", 0.0, dim_head=512) == MEMORY_EFFICIENT
    assert kernel("full", 0.0, torch.float64) == MATH
    # explicit paths
    assert kernel("axial_row", 0.0, impl="sdpa") == DENSE_BIAS
    assert kernel("axial_row", 0.0, impl="gather") == FLASH
    assert kernel("sparse", 0.1, impl="gather") == MEMORY_EFFICIENT
    assert kernel("conv_like", 0.0, impl="dense") == MATH
    with pytest.raises(ConfigError, match="cannot apply --attn_dropout"):
        kernel("axial_row", 0.1, impl="flex")


class SdpaOps(TorchDispatchMode):
    """(fused, mask shape) of each SDPA a forward runs on CPU: fused is its flash kernel;
    the math path decomposes into plain ops and leaves no SDPA op behind. `softmaxes`: the
    width of each softmax run outside SDPA (n for the math path and the dense reference,
    text + band keys for the band matmuls)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[bool, tuple[int, ...] | None]] = []
        self.softmaxes: list[int] = []
        self.masked_in_place = 0  # the band matmuls hide keys in place; SDPA's math adds a bias

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_scaled_dot_product_flash_attention_for_cpu":
            mask = kwargs.get("attn_mask")
            self.calls.append((True, None if mask is None else tuple(mask.shape)))
        elif name in ("_softmax", "_safe_softmax"):
            self.softmaxes.append(args[0].shape[-1])
        elif name == "masked_fill_":
            self.masked_in_place += 1
        return func(*args, **kwargs)


def observed(name: str, dropout: float, impl: str = "auto") -> str:
    """The kernel a CPU layer of `name` ran: its SDPA calls, as kernels.py names them.
    The probe is a TorchDispatchMode, as `train --flops`'s FLOP counter is: the axial
    band's CausalBias must be built under it too."""
    paths.lower_right_causal.cache_clear()
    layout = SMALL
    layer = make_layer(make_pattern(name, {}), impl).float().train()
    layer.dropout = dropout
    n = layout.seq_len
    x = torch.randn(1, n, DIM)
    probe = SdpaOps()
    with probe, torch.no_grad():
        layer(x, layout)
    if probe.masked_in_place and max(probe.softmaxes) < n:
        return BAND_MATMULS  # scores over a band of keys, never a row of all n
    if probe.softmaxes or not probe.calls:
        return MATH
    return DENSE_BIAS if any(m is not None and m[-2:] == (n, n) for _, m in probe.calls) else FLASH


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_cpu_kernels_are_the_ones_that_run(dropout: float) -> None:
    """Bug caught: a name that is not what runs (a 5-D gather falling to the math path
    while named flash, a dense mask named flash)."""
    for name in PATTERNS:
        for impl in ("auto", "sdpa", "gather", "matmul"):
            expected = kernel(name, dropout, FP32, None, impl, SMALL, 4)
            assert observed(name, dropout, impl) == expected, (name, impl, dropout)


def test_plan_and_check_print_a_line_per_pattern() -> None:
    """`plan`'s advice and `check`'s facts carry the same names, one line per pattern."""
    from dalle_dist.check.environment import kernel_facts, kernel_lines
    from dalle_dist.model.config import DALLEConfig
    from dalle_dist.plan.advice import attention_kernels
    from dalle_dist.plan.advice import kernel_lines as plan_lines

    config = DALLEConfig(num_text_tokens=10, num_image_tokens=16, image_fmap_size=32,
                         dim_head=64, attn_dropout=0.1, attn_types=("full", "axial_row",
                                                                    "sparse", "axial_row"))
    kernels = attention_kernels(config, "cuda", "auto", ("bf16", "fp32"))
    assert kernels["patterns"]["axial_row"]["bf16"] == {"path": "gather", "kernel": FLASH}
    lines = plan_lines(kernels)
    assert len(lines) == 4 and lines[2].split() == [
        "axial_row", *f"{FLASH} in bf16, {MEMORY_EFFICIENT} in fp32 (path: gather)".split()]
    facts = kernel_facts()
    assert list(facts["patterns"]) == list(PATTERNS)
    assert len(kernel_lines(facts)) == 1 + len(PATTERNS)
