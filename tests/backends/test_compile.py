"""`train --compile` on 2 CPU ranks of every backend: 20 steps whose losses are one eager
process's within fp32 rounding, the compile reported once, ranks consistent.

What can go wrong across ranks is the order (compiled before DDP, FSDP2's fully_shard,
DeepSpeed or Horovod wrap the model), the hooks (FSDP2's gathers and reshards around a
compiled block, with activation checkpointing recomputing inside its graph; ZeRO-3's
gathers, moved onto each block by making it a leaf module; the gradient hooks of DDP,
ZeRO-2 and Horovod) and recompiles; dynamo and AOTAutograd meet those the same whatever
compiles their graphs. So FSDP2, the one engine that changes what a block's graph holds
(unsharded parameters gathered around it, freed after it, gathered again for the
checkpointed recompute), runs inductor, the default; DDP, ZeRO-2, ZeRO-3 and Horovod run
aot_eager, which traces the same graphs without inductor's C++ compile (7 to 13 s a graph
per launch on this machine with an empty cache; inductor's numerics are
tests/train/test_compile.py's, in one process).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.backends.runs import (
    COMPILE_PATTERNS,
    TWENTY_STEPS,
    Run,
    assert_compiled_like_eager,
    assert_ranks_consistent,
)

COMPILED = {
    "torch": ("--compile", "--compile_backend", "aot_eager"),
    "fsdp": ("--compile", "--reversible"),
    "deepspeed-zero2": ("--compile", "--compile_backend", "aot_eager"),
    "deepspeed-zero3": ("--compile", "--compile_backend", "aot_eager"),
    "horovod": ("--compile", "--compile_backend", "aot_eager", "--reversible"),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_two_ranks_equal_one_eager_process(name: str,
                                                    trained: Callable[..., Run]) -> None:
    """20 compiled steps on 2 ranks against 20 eager ones in one process (global batch 16
    both): losses, gradient norms and final weights within fp32 rounding, one compile
    line, no recompile, the ranks' digests as the backend's. Bugs: a compiled block whose
    output is off by 1e-4 (weights 1.2e-5 away, on every backend); a --compile that
    compiled nothing (no compile line); a block traced again (the log's recompile
    warning, and 4 graphs for 2)."""
    eager = trained("single", "fp32", *COMPILE_PATTERNS, *TWENTY_STEPS)
    run = trained(name, "fp32", *COMPILE_PATTERNS, *TWENTY_STEPS, *COMPILED[name])
    backend = "aot_eager" if "aot_eager" in COMPILED[name] else "inductor"
    assert_compiled_like_eager(run, eager, backend, blocks=2, graphs=2)
    assert_ranks_consistent(name, run.text)
