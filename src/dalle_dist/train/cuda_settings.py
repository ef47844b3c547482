"""The process-wide CUDA math settings a command makes once, before its model runs: TF32
for fp32 matmuls and convolutions, and cuDNN's choice of convolution algorithms by timing.

`train`, `train-vae` and `generate` apply the same ones, so fp32 runs as fast in each.
On CPU nothing is touched: the settings are process-wide and mean nothing there.
"""

from __future__ import annotations

import torch

#: What a command logs when TF32 is on (with the flag that turns it off).
TF32_ON = "fp32 matmuls and convolutions run in TF32 (--no_tf32: full fp32)"


def set_tf32(device: torch.device, enabled: bool) -> bool:
    """TensorFloat-32 for fp32 matmuls and cuDNN convolutions when the run is on CUDA (on
    by default: --no_tf32 turns it off); returns whether it is on.

    Matmuls go through set_float32_matmul_precision and convolutions through cudnn's
    allow_tf32, the spellings every torch since 2.4 has; torch >= 2.9 reads them back
    through its new fp32_precision settings as well (setting those instead would make
    any later read of the old ones raise)."""
    if device.type != "cuda":
        return False
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
    return enabled


def set_cudnn_benchmark(device: torch.device) -> bool:
    """cuDNN times the algorithms for each new convolution shape and keeps the fastest
    (torch.backends.cudnn.benchmark) when the run is on CUDA; returns whether it is on.

    The convolutions run at a few fixed shapes (the frozen VAE's or VQGAN's encoder at the
    batch size, train-vae's VAE, generate's decode per batch size), so each shape is timed
    once and its fastest algorithm kept for the run. Off under torch's deterministic mode
    (torch.use_deterministic_algorithms, or cuDNN's own torch.backends.cudnn.deterministic;
    selftest's resume check turns both on, and dalle-dist has no flag of its own for
    them): the pick by timing can differ between two processes, and with it the
    convolutions' rounding, so a resumed run would not repeat an uninterrupted one bit for
    bit. Outside deterministic mode torch promises no bit-for-bit repeats on CUDA anyway."""
    if device.type != "cuda":
        return False
    enabled = not (torch.are_deterministic_algorithms_enabled()
                   or torch.backends.cudnn.deterministic)
    torch.backends.cudnn.benchmark = enabled
    return enabled
