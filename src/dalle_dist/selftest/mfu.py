"""The two halves of a model FLOPs utilisation (MFU): the FLOPs a DALL-E training step
needs by formula, and the FLOP/s this device reaches on a plain matmul.

The formula is not what train/flops.py counts: `--flops_profiler` counts every op that
ran (torch.utils.flop_counter), while MFU by convention counts the model's matmuls only,
from its shapes, so that two implementations of one model are held to one number. The
peak is measured, not read off a datasheet, so an MFU here means "of what this device
did on a matmul in that dtype". bench/train_step.py reports MFU with the same formula.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dalle_dist.model import DALLEConfig

#: The dtypes whose matmul peak MFU is measured against; "tf32" is fp32 with TF32 tensor
#: cores (what fp32 training runs in on CUDA when TF32 is on).
PEAK_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
               "fp16": torch.float16}


def training_flops_per_step(cfg: DALLEConfig, batch: int) -> float:
    """Matmul FLOPs of one training step of `batch` samples (3 x the forward: backward
    costs twice the forward). Per token and layer, forward: 2 * (4*d*inner +
    3*ff_mult*d*d) (qkv + out; GEGLU in/out) + 2 * 2 * n * inner (QK^T and AV over n
    keys); per token, the logits: 2 * d * the vocabulary of its position."""
    inner = cfg.heads * cfg.dim_head
    n = cfg.text_seq_len + cfg.image_seq_len  # sequence length fed to the transformer
    per_token_layer = 2 * (4 * cfg.dim * inner + 3 * cfg.ff_mult * cfg.dim * cfg.dim)
    per_token_layer += 2 * 2 * n * inner
    text_vocab = cfg.num_text_tokens + cfg.text_seq_len
    logits = 2 * cfg.dim * (cfg.text_seq_len * text_vocab + cfg.image_seq_len
                            * cfg.num_image_tokens)
    forward = batch * (n * cfg.depth * per_token_layer + logits)
    return 3.0 * forward


def device_matmul_peak(device: torch.device, name: str, size: int, repeats: int = 5,
                       inner: int = 1) -> float:
    """Best FLOP/s of `inner` square matmuls of side `size` in PEAK_DTYPES[name] on
    `device`: the practical peak training's MFU is held against. On CUDA each timing is
    fenced by synchronize (an idle GPU; nothing else queued)."""
    dtype = PEAK_DTYPES[name]
    cuda = device.type == "cuda"
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
    try:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        best = float("inf")
        for attempt in range(repeats + 2):
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(inner):
                a @ b
            if cuda:
                torch.cuda.synchronize(device)
            if attempt >= 2:  # the first two warm the kernels and the allocator
                best = min(best, time.perf_counter() - start)
    finally:
        torch.set_float32_matmul_precision(saved)
    return 2 * size**3 * inner / best


def matmul_peaks(device: torch.device) -> dict[str, float]:
    """FLOP/s of a big square matmul per dtype (CUDA: side 8192, ten per timing; CPU:
    side 1024, fp32 only)."""
    if device.type == "cuda":
        return {name: device_matmul_peak(device, name, 8192, repeats=3, inner=10)
                for name in PEAK_DTYPES}
    # fp32 only: CPU matmuls in bf16 / fp16 are not what a CPU is fast at, so an MFU
    # against them says nothing; no TF32 on a CPU either
    fp32 = device_matmul_peak(device, "fp32", 1024, repeats=3)
    return {"fp32": fp32, "tf32": fp32}


#: Datasheet dense bf16 tensor-core peaks (FLOP/s, no sparsity) by a piece of the name CUDA
#: gives the device, most specific first. Published MFUs are usually held against these,
#: not against a measured matmul, so a figure compared with one needs them too.
DATASHEET_BF16_PEAKS = (
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
    ("A100", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
)


def datasheet_bf16_peak(device_name: str) -> float | None:
    """The datasheet dense bf16 peak of the GPU called `device_name`
    (torch.cuda.get_device_properties(...).name), or None for a device not in
    DATASHEET_BF16_PEAKS."""
    return next((peak for part, peak in DATASHEET_BF16_PEAKS if part in device_name), None)
