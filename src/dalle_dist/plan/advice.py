"""The recommendation `dalle-dist plan` prints: per precision, the cheapest backend that fits
the batch, the largest batch it takes, and the backend that goes further."""

from __future__ import annotations

from collections.abc import Sequence

from dalle_dist.backends.precision_kinds import PRECISION_KINDS
from dalle_dist.plan.rows import BACKEND_ORDER, Row
from dalle_dist.plan.units import format_bytes

#: Of a GPU's memory, what a plan fills: the caching allocator's fragmentation and the
#: cuBLAS / cuDNN workspaces take the rest.
USABLE_FRACTION = 0.9


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
    for precision in sorted({r.precision for r in rows}, key=_advice_order):
        chain = sorted((r for r in rows if r.precision == precision and
                        (r.gpus == gpus or gpus == 1)),
                       key=lambda r: order[(r.backend, r.zero_stage)])
        advice.setdefault(_sentence(chain, batch, gpus, gpu_memory_bytes, budget), []).append(
            precision)
    return " ".join(f"{' / '.join(names)}: {text}" for text, names in advice.items())


def _advice_order(precision: str) -> tuple[int, bool]:
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
