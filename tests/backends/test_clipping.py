"""--clip_grad_norm clips, on every backend: the first optimizer step of a real `train` run
equals a step whose gradient was clipped by hand, and not the unclipped step.

Adam hides a clip that scales every gradient by one factor: its first step is
lr * g / (|g| + eps), the same for g and c * g. So the max norm here is far below the
gradient's norm (1e-6 against about 4): the clipped gradients' elements fall under Adam's eps
(1e-8), and the clipped step moves each weight by a fraction of the unclipped one.
tests/backends/clip_probe.py replays the step in plain torch on one process (the whole
global batch, 2 ranks x 2 micro-batches x 4 against 1 x 16) and measures both distances.
The run is the one tests/backends/test_host_syncs.py reads (tests/backends/conftest.py).

What would fail: an Engine.clip_grad_norm that returns the norm without scaling (the bug
that passed every equivalence test), DeepSpeed's gradient_clipping left at 0, Horovod
clipping before its all-reduce has finished, FSDP2 clipping each shard by its own norm, the
loop or the CLI dropping --clip_grad_norm on its way to the engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.backends.conftest import PROBED, PROBED_MAX_NORM
from tests.backends.runs import ATOL


@pytest.mark.parametrize("name", PROBED)
def test_clip_grad_norm_clips(name: str, probed_run: Callable[[str], Path]) -> None:
    found = json.loads((probed_run(name) / "clip.json").read_text())
    assert found["world_size"] == (1 if name == "single" else 2)
    assert found["max_norm"] == PROBED_MAX_NORM
    assert found["grad_norm"] > 1e4 * PROBED_MAX_NORM, "the max norm must bind"
    # The oracle can tell the two apart by far more than the tolerance ...
    assert found["clipped_to_unclipped"] > 100 * ATOL, found
    # ... and the engine's step is the clipped one.
    assert found["to_clipped"] <= ATOL, found
    assert found["to_unclipped"] > 100 * ATOL, found
