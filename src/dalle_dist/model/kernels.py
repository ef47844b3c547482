"""Which kernel computes a pattern's attention: the path resolve_impl picks (attention.py),
then the kernel that path reaches on the device, for `plan` and `check` to print.

  flash (SDPA)              SDPA's flash kernel: no mask at all (full's is_causal, or an
                            axial band's lower-right CausalBias); CUDA: 16-bit, compute
                            capability 8.0 or later, dim_head <= 256; CPU: its flash
                            kernel, which takes masks too but no dropout
  FlexAttention             the flex path: a BlockMask skips empty tiles; no dropout, so
                            never chosen while a layer trains with --attn_dropout
  memory-efficient SDPA     SDPA's memory-efficient kernel (CUDA, capability 5.0 or later,
                            bf16 from 8.0): fp32, or a boolean mask over a gathered band
                            or block of keys (conv_like, sparse through --attn_impl gather)
  masked SDPA (dense bias)  a fused SDPA kernel (memory-efficient on CUDA, flash on CPU)
                            reading the pattern's n x n mask as a bias: every tile is
                            computed, the mask only zeroes it
  band matmuls              the matmul path: a band pattern's scores (text + its band of
                            grid lines per query) as plain matmuls and one masked softmax;
                            saves those probabilities, never n x n ones
  math                      no fused kernel: the dense reference, SDPA's math path
                            (CUDA fp64 or an older GPU; on CPU with dropout), which
                            materialises the n x n scores

The SDPA rules are those of torch's dispatcher (flash, then memory-efficient, then math),
as of the torch this package pins; they decide nothing here, they only name the outcome.
Why the remaining non-flash choices stay: docs/design.md, "Attention patterns".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dalle_dist.model.attention import resolve_impl
from dalle_dist.model.config import DALLEConfig
from dalle_dist.model.patterns import (
    AttentionPattern,
    AxialColPattern,
    AxialRowPattern,
    PatternOptions,
    SequenceLayout,
    build_pattern,
)
from dalle_dist.model.toolchain import require_toolchain

FLASH = "flash (SDPA)"
FLEX = "FlexAttention"
MEMORY_EFFICIENT = "memory-efficient SDPA"
DENSE_BIAS = "masked SDPA (dense bias)"
BAND_MATMULS = "band matmuls"
MATH = "math"
KERNELS: tuple[str, ...] = (FLASH, FLEX, MEMORY_EFFICIENT, DENSE_BIAS, BAND_MATMULS, MATH)

#: Capability (major, minor) SDPA's CUDA flash kernel needs; bf16 needs it too.
FLASH_CAPABILITY = (8, 0)
#: Capability the memory-efficient kernel needs.
MEMORY_EFFICIENT_CAPABILITY = (5, 0)
FLASH_MAX_DIM_HEAD = 256

Capability = tuple[int, int]


def sdpa_kernel(dtype: torch.dtype, capability: Capability | None, dim_head: int,
                dropout: float, masked: bool) -> str:
    """The kernel scaled_dot_product_attention dispatches 4-D inputs to: on a CUDA device
    of `capability`, or on CPU (capability None), with a boolean mask (`masked`) or none."""
    if capability is None:  # CPU: one fused kernel, which applies no dropout
        return MATH if dropout else FLASH
    sixteen_bit = dtype in (torch.float16, torch.bfloat16)
    if (not masked and sixteen_bit and capability >= FLASH_CAPABILITY
            and dim_head <= FLASH_MAX_DIM_HEAD):
        return FLASH
    if ((dtype in (torch.float32, torch.float16) and capability >= MEMORY_EFFICIENT_CAPABILITY)
            or (dtype == torch.bfloat16 and capability >= FLASH_CAPABILITY)):
        return MEMORY_EFFICIENT
    return MATH


def attention_kernel(pattern: AttentionPattern, layout: SequenceLayout, attn_impl: str,
                     dropout: float, dtype: torch.dtype, capability: Capability | None,
                     dim_head: int) -> tuple[str, str]:
    """(path, kernel) of a training layer of `pattern`: the path resolve_impl takes for
    `attn_impl` with `dropout` on (CUDA when `capability` is given, else CPU), and the
    kernel that path reaches in `dtype` (one of KERNELS)."""
    device = torch.device("cuda" if capability is not None else "cpu")
    path = resolve_impl(attn_impl, pattern, device, layout, dropout)
    if path == "flex":
        return path, FLEX
    if path == "dense":
        return path, MATH
    if path == "matmul":
        return path, BAND_MATMULS
    if path == "sdpa":
        masked = not pattern.causal_only
    else:  # gather: an axial band is causal from its last key, the others carry a mask
        masked = not isinstance(pattern, (AxialRowPattern, AxialColPattern))
    kernel = sdpa_kernel(dtype, capability, dim_head, dropout, masked)
    if path == "sdpa" and masked and kernel != MATH:
        return path, DENSE_BIAS
    return path, kernel


def config_kernels(c: DALLEConfig, attn_impl: str, dtype: torch.dtype,
                   capability: Capability | None,
                   dropout: float | None = None) -> dict[str, tuple[str, str]]:
    """{pattern: (path, kernel)} of a training layer of each of c's patterns (in the
    order --attn_types names them), with c's --attn_dropout unless `dropout` is given."""
    options = PatternOptions(c.conv_kernel_size, c.conv_dilation, c.sparse_random_blocks,
                             c.sparse_seed)
    layout = SequenceLayout(text_len=c.text_seq_len + 1, fmap_size=c.image_fmap_size)
    rate = c.attn_dropout if dropout is None else dropout
    return {name: attention_kernel(build_pattern(name, options), layout, attn_impl, rate,
                                   dtype, capability, c.dim_head)
            for name in dict.fromkeys(c.attn_types)}


def cuda_capability() -> Capability | None:
    """This machine's first GPU's compute capability (None: no CUDA device)."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(0)


def by_precision(kernels: dict[str, str]) -> str:
    """{precision: kernel} as one phrase, precisions with the same kernel grouped:
    "flash (SDPA) in bf16 / fp16, memory-efficient SDPA in fp32", or one kernel alone."""
    groups: dict[str, list[str]] = {}
    for precision, kernel in kernels.items():
        groups.setdefault(kernel, []).append(precision)
    if len(groups) == 1:
        return next(iter(groups))
    return ", ".join(f"{kernel} in {' / '.join(names)}" for kernel, names in groups.items())


def flex_patterns(attn_types: Sequence[str], attn_impl: str) -> list[str]:
    """The patterns of `attn_types` whose layers run FlexAttention on CUDA with `attn_impl`
    when they apply no dropout: in validation and sampling always, in training unless
    --attn_dropout. Only the pattern's kind decides that (resolve_impl), not its sizes."""
    cuda = torch.device("cuda")
    return [name for name in dict.fromkeys(attn_types)
            if resolve_impl(attn_impl, build_pattern(name), cuda) == "flex"]


def check_flex_toolchain(attn_types: Sequence[str], attn_impl: str, device: torch.device
                         ) -> None:
    """Refuse, before the run, a CUDA run whose FlexAttention inductor cannot compile here
    (model/toolchain.py): it would fail at its first band layer with Triton's traceback."""
    if device.type != "cuda":
        return
    names = flex_patterns(attn_types, attn_impl)
    if names:
        require_toolchain("cuda", f"FlexAttention (--attn_impl {attn_impl}, for "
                          f"{', '.join(names)})", "--attn_impl gather, which compiles nothing")
