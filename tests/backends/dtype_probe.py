"""`python -m tests.backends.dtype_probe ARGS` runs `python -m dalle_dist ARGS` and prints, on
the root rank, the dtypes the model's first training step computed in, as one line:

    dtype probe: {"params": [...], "norms": [...], "loss": [...]}

params: the dtypes of the module's parameters as the forward sees them (a backend that
casts the model shows bfloat16 here); norms: what every LayerNorm returned; loss: the dtype
of the model's `loss` (cross_entropy's log-softmax over the logits, which autocast runs in
fp32). The hooks are forward hooks on the bare module, around the step the loop's own
precision line watches (`loop._watch_precision`), so they see what the engine's forward
really ran, whatever wraps the module. Nothing else changes: the numbers are the run's.
tests/backends/runs.py starts the torch and DeepSpeed runs through it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dalle_dist.train import loop

LINE = "dtype probe: "


def _names(dtypes: set[torch.dtype]) -> list[str]:
    return sorted(str(d).removeprefix("torch.") for d in dtypes)


@contextlib.contextmanager
def recording(module: nn.Module) -> Iterator[dict[str, set[torch.dtype]]]:
    """The dtypes of `module`'s parameters, LayerNorm outputs and loss while inside."""
    seen: dict[str, set[torch.dtype]] = {
        "params": {p.dtype for p in module.parameters()}, "norms": set(), "loss": set()}

    def norm(_layer: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        seen["norms"].add(output.dtype)

    def model(_module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
            seen["loss"].add(output["loss"].dtype)

    handles = [layer.register_forward_hook(norm)
               for layer in module.modules() if isinstance(layer, nn.LayerNorm)]
    handles.append(module.register_forward_hook(model))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def install() -> None:
    watch = loop._watch_precision

    @contextlib.contextmanager
    def probed(engine: Any, backend: Any, log: Any, first: bool) -> Iterator[None]:
        if not first:
            with watch(engine, backend, log, first):
                yield
            return
        with recording(engine.module) as seen, watch(engine, backend, log, first):
            yield
        if backend.is_root:
            print(LINE + json.dumps({key: _names(found) for key, found in seen.items()}),
                  flush=True)

    loop._watch_precision = probed  # type: ignore[assignment]


def main() -> int:
    install()
    from dalle_dist.cli import main as dalle_main

    return dalle_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
