"""--flops_profiler: the FLOPs of one forward and backward, per top-level module, the step's
achieved FLOP/s and its model FLOPs utilisation (MFU) against a measured matmul peak.

DALLE-pytorch turns on DeepSpeed's profiler at step 200 and stops there, under DeepSpeed
only. Here every backend runs the same code on its wrapped model (DDP, FSDP2, DeepSpeed,
Horovod): torch.utils.flop_counter counts what the ops did (matmuls, convolutions,
attention kernels), attributed to the modules that ran them, forward and backward apart.
The time is that of real optimizer steps (ga_steps micro-batches each, taken in memory
and never saved), after a warm-up step; the peak is a large matmul timed on the same
device in the run's precision, so MFU means "of what this device did on a matmul", not
of a datasheet figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import (
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from dalle_dist.backends import DistributedBackend, Engine

#: the model's own ops outside its child modules (DALL-E: the logits and the loss)
OWN = "(outside submodules)"
TIMED_STEPS = 3
#: matmul side for the peak: large enough to saturate a GPU, quick on a CPU
PEAK_SIDE = {"cuda": 8192, "cpu": 1024}
PEAK_REPEATS = {"cuda": 20, "cpu": 3}


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
              **kwargs: Any) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                       out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def cpu_attention_formulas() -> dict[Any, Callable[..., int]]:
    """torch counts its CUDA attention kernels but not the CPU one SDPA takes here (its
    flash kernel for CPU): the same formula for it, or attention would count as 0 on CPU."""
    aten = torch.ops.aten
    formulas: dict[Any, Callable[..., int]] = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", _cpu_sdpa),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward",
                           _cpu_sdpa_backward)):
        if hasattr(aten, name):
            formulas[getattr(aten, name)] = formula
    return formulas


@dataclass
class ModuleFlops:
    """FLOPs of one forward and one backward by the model's top-level modules (in order,
    then OWN: what the model does outside them)."""

    forward: dict[str, int]
    backward: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.forward.values()) + sum(self.backward.values())

    def of(self, name: str) -> int:
        return self.forward[name] + self.backward[name]


def _by_child(counts: dict[str, dict[Any, int]], children: list[str]) -> dict[str, int]:
    """Sum each child's counts; FlopCounterMode names modules by their path from the
    outermost module that ran (`DistributedDataParallel.module.transformer`,
    `FSDPDALLE.transformer`, `DeepSpeedEngine.module.transformer`): the model's own name is
    the shortest prefix that has one of its children under it."""
    total = sum(counts.get("Global", {}).values())
    prefixes = sorted({key[: -len(child) - 1] for key in counts for child in children
                       if key.endswith("." + child)}, key=len)
    root = prefixes[0] if prefixes else None
    rows = {child: sum(counts.get(f"{root}.{child}", {}).values()) if root else 0
            for child in children}
    rows[OWN] = total - sum(rows.values())
    return rows


def count_flops(model: nn.Module, forward: Callable[[], torch.Tensor],
                backward: Callable[[torch.Tensor], None]) -> ModuleFlops:
    """The FLOPs of `forward()` (returning the loss) and `backward(loss)`, by the
    top-level modules of `model` (the bare model; forward may run it through a wrapper)."""
    children = [name for name, _ in model.named_children()]
    with FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas()) as counter:
        loss = forward()
        after_forward = counter.get_flop_counts()
        backward(loss)
        after_all = counter.get_flop_counts()
    forward_rows = _by_child(after_forward, children)
    all_rows = _by_child(after_all, children)
    return ModuleFlops(forward_rows, {k: all_rows[k] - forward_rows[k] for k in all_rows})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """FLOP/s of a large square matmul on `device` in `dtype`, and what was timed."""
    side = PEAK_SIDE.get(device.type, PEAK_SIDE["cpu"])
    repeats = PEAK_REPEATS.get(device.type, PEAK_REPEATS["cpu"])
    a = torch.randn(side, side, device=device).to(dtype)
    b = torch.randn(side, side, device=device).to(dtype)
    for _ in range(2):
        a @ b
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _sync(device)
    elapsed = time.perf_counter() - started
    return 2 * side**3 * repeats / elapsed, f"{dtype_name(dtype)} {side}x{side} matmul"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def human(flops: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(flops) >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} "


@dataclass
class FlopReport:
    flops: ModuleFlops
    micro_batch: int  # samples per rank in the counted forward
    ga_steps: int
    world_size: int
    step_s: float  # one optimizer step, the slowest rank's mean
    peak: float  # FLOP/s per rank
    peak_what: str
    model_name: str

    @property
    def step_flops(self) -> int:
        """Per rank: the counted micro-batch times the micro-batches of a step."""
        return self.flops.total * self.ga_steps

    @property
    def achieved(self) -> float:
        return self.step_flops / self.step_s

    @property
    def mfu(self) -> float:
        return self.achieved / self.peak

    def lines(self) -> list[str]:
        flops = self.flops
        total = max(flops.total, 1)
        labels = {name: f"{self.model_name} {name}" if name == OWN else name
                  for name in flops.forward}
        width = max(len(label) for label in labels.values()) + 2
        rows = [f"{'module':<{width}}{'forward':>12}{'backward':>12}{'total':>12}{'share':>8}"]
        for name, label in labels.items():
            rows.append(f"{label:<{width}}{human(flops.forward[name]) + 'FLOP':>12}"
                        f"{human(flops.backward[name]) + 'FLOP':>12}"
                        f"{human(flops.of(name)) + 'FLOP':>12}"
                        f"{100 * flops.of(name) / total:>7.1f}%")
        rows.append(f"{'total':<{width}}{human(sum(flops.forward.values())) + 'FLOP':>12}"
                    f"{human(sum(flops.backward.values())) + 'FLOP':>12}"
                    f"{human(flops.total) + 'FLOP':>12}{100.0:>7.1f}%")
        ranks = f" x {self.world_size} ranks" if self.world_size > 1 else ""
        return [f"--flops_profiler: FLOPs of one forward and backward of {self.micro_batch} "
                f"sample(s) per rank (torch.utils.flop_counter)", *rows,
                f"step: {self.ga_steps} micro-batch(es) = {human(self.step_flops)}FLOP "
                f"({self.flops.total} FLOP per micro-batch) per rank{ranks}, "
                f"{self.step_s * 1000:.1f} ms (mean of {TIMED_STEPS} optimizer "
                f"steps after a warm-up, slowest rank)",
                f"achieved {human(self.achieved)}FLOP/s per rank; measured peak "
                f"{human(self.peak)}FLOP/s ({self.peak_what}); MFU {100 * self.mfu:.2f}%"]


def profile_step(model: nn.Module, engine: Engine, backend: DistributedBackend,
                 inputs: Callable[[Any], tuple[Any, ...]], micro_batches: list[Any],
                 take_step: Callable[[int], None]) -> FlopReport:
    """Collective: every rank times `take_step` (one optimizer step over micro_batches)
    after a warm-up, measures its matmul peak, then counts one forward and backward of the
    first micro-batch through the engine; the report has the slowest rank's time and the
    ranks' mean peak."""
    device = backend.device
    take_step(1)  # warm-up: allocator, kernels, DeepSpeed's buffers
    _sync(device)
    started = time.perf_counter()
    for step in range(2, 2 + TIMED_STEPS):
        take_step(step)
    _sync(device)
    step_s = (time.perf_counter() - started) / TIMED_STEPS
    # the backend's precision, not the engine's: DeepSpeed's engine says fp32 (it applies
    # its own autocast) while its matmuls run in bf16 or fp16
    peak, what = matmul_peak(device, backend.precision().dtype or torch.float32)
    args = inputs(micro_batches[0])

    def backward(loss: torch.Tensor) -> None:
        engine.backward(loss)

    with engine.micro_batch(last=True):
        flops = count_flops(model, lambda: engine.forward(*args)["loss"], backward)
    times = backend.all_gather_object(step_s, "the step times of --flops_profiler")
    peaks = backend.all_gather_object(peak, "the matmul peaks of --flops_profiler")
    return FlopReport(flops, len(micro_batches[0][0]), len(micro_batches),
                      backend.world_size, max(times), sum(peaks) / len(peaks), what,
                      type(model).__name__.removeprefix("FSDP"))
