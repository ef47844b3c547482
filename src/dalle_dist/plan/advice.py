"""The recommendation `dalle-dist plan` prints: per precision, the cheapest backend that fits
the batch, the largest batch it takes, and the backend that goes further; and the attention
kernel each pattern of the run will use (model/kernels.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.model.config import DALLEConfig
from dalle_dist.model.kernels import Capability, by_precision, config_kernels, cuda_capability
from dalle_dist.plan.rows import BACKEND_ORDER, Row
from dalle_dist.plan.units import format_bytes

#: Of a GPU's memory, what a plan fills: the caching allocator's fragmentation and the
#: cuBLAS / cuDNN workspaces take the rest.
USABLE_FRACTION = 0.9
#: The GPU a CUDA plan names kernels for when this machine has none: Ampere or later.
ASSUMED_CAPABILITY: Capability = (8, 0)


def recommend(rows: Sequence[Row], gpu_memory_bytes: int,
              usable_fraction: float = USABLE_FRACTION) -> str:
    """One sentence per precision (bf16 first): the cheapest backend that fits the batch,
    the largest batch it takes, and the backend that goes further."""
    budget = int(gpu_memory_bytes * usable_fraction)
    if not rows:
        return "nothing to recommend"
    gpus = max(r.gpus for r in rows)
    batch = next(r.micro_batch * r.gpus for r in rows)
    order = {key: i for i, key in enumerate(BACKEND_ORDER)}
    advice: dict[str, list[str]] = {}  # sentence -> the precisions it holds for
    # Smaller elements first; of equal size, the one without loss scaling (bf16 before fp16).
    for precision in sorted({r.precision for r in rows}, key=advice_order):
        chain = sorted((r for r in rows if r.precision == precision and
                        (r.gpus == gpus or gpus == 1)),
                       key=lambda r: order[(r.backend, r.zero_stage)])
        advice.setdefault(_sentence(chain, batch, gpus, gpu_memory_bytes, budget), []).append(
            precision)
    return " ".join(f"{' / '.join(names)}: {text}" for text, names in advice.items())


def advice_order(precision: str) -> tuple[int, bool]:
    """The order precisions are advised in: smaller elements first; of equal size, the one
    without loss scaling (bf16 before fp16)."""
    kind = PRECISION_KINDS[precision]
    return kind.itemsize, kind.loss_scaled


def _sentence(chain: list[Row], batch: int, gpus: int, memory: int, budget: int) -> str:
    where = f"{gpus} x {format_bytes(memory, si=True)}"
    fits = [r for r in chain if r.max_batch(budget) >= batch]
    if not fits:
        best = max(chain, key=lambda r: r.max_batch(budget))
        largest = best.max_batch(budget)
        if largest == 0:
            least = min(chain, key=lambda r: r.peak_at(1))
            return (f"does not fit on {where} even with ZeRO-3 (the leanest, {least.label}, "
                    f"needs {format_bytes(least.peak_at(1))} per GPU at batch {least.gpus}).")
        return (f"batch {batch} does not fit on {where} even with ZeRO-3; the largest that "
                f"fits is {largest}, with {best.label}.")
    first = fits[0]
    top = first.max_batch(budget)
    text = f"fits with {first.label} up to batch {top}"
    if first is not chain[0]:
        text += f" ({chain[0].label}: up to {chain[0].max_batch(budget)})"
    further = [r for r in chain[chain.index(first) + 1:] if r.max_batch(budget) > top]
    if further:
        nxt = further[0]
        text += f"; {nxt.label} above that (up to {nxt.max_batch(budget)})"
        best = max(further, key=lambda r: r.max_batch(budget))
        if best.max_batch(budget) > nxt.max_batch(budget):
            text += f"; at most {best.max_batch(budget)}, with {best.label}"
    return text + "."


def attention_kernels(c: DALLEConfig, device: str, attn_impl: str,
                      precisions: Sequence[str]) -> dict[str, Any]:
    """The kernel of each of c's patterns per precision, for --json's `attention_kernels`:
    {"capability": "9.0" (this machine's GPU; 8.0 assumed without one; null on cpu),
    "assumed": bool, "attn_dropout": float,
    "patterns": {pattern: {precision: {"path": str, "kernel": str}}}}."""
    capability: Capability | None = None
    assumed = False
    if device == "cuda":
        capability = cuda_capability()
        assumed = capability is None
        capability = capability or ASSUMED_CAPABILITY
    patterns: dict[str, dict[str, dict[str, str]]] = {}
    for precision in precisions:
        dtype = PRECISION_KINDS[precision].dtype or torch.float32
        for name, (path, kernel) in config_kernels(c, attn_impl, dtype, capability).items():
            patterns.setdefault(name, {})[precision] = {"path": path, "kernel": kernel}
    return {"capability": None if capability is None else "{}.{}".format(*capability),
            "assumed": assumed, "attn_dropout": c.attn_dropout, "patterns": patterns}


def kernel_lines(kernels: dict[str, Any]) -> list[str]:
    """`attention_kernels` as text: a heading, then a line per pattern."""
    where = ("cpu" if kernels["capability"] is None else
             f"cuda, compute capability {kernels['capability']}"
             + (" assumed (no GPU here)" if kernels["assumed"] else ""))
    dropout = kernels["attn_dropout"]
    lines = [f"attention kernels on {where}" + (f", --attn_dropout {dropout}" if dropout
                                                 else "") + ":"]
    width = max(len(name) for name in kernels["patterns"])
    for name, per in kernels["patterns"].items():
        paths = dict.fromkeys(entry["path"] for entry in per.values())
        text = by_precision({p: entry["kernel"] for p, entry in per.items()})
        lines.append(f"  {name:<{width}}  {text} (path: {', '.join(paths)})")
    return lines
