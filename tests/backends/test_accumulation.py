"""--ga_steps on every backend: an optimizer step of 4 micro-batches equals one of the whole
batch.

With the same global batch (16: 2 ranks x 4 micro-batches x 2 samples against 2 ranks x 8),
each step sees the same 16 samples (one DistributedSampler; a rank's micro-batches are
consecutive slices of its share), so after 5 steps the weights must agree with the
--ga_steps 1 run of the same backend to the tolerances of the rank-equivalence tests, and
so must every step's loss and pre-clip gradient norm.

What would fail:
- a micro-batch's loss not divided by --ga_steps: the gradient and its logged norm are 4x
  (clipping and Adam would hide it from the weights; the norm does not);
- a step counted per micro-batch (DeepSpeed's old meaning): 20 steps in the checkpoint, 20
  metrics lines, and the LR schedule and save/log/sample intervals running 4x faster;
- Horovod all-reducing each micro-batch's gradient as if it were a step
  (backward_passes_per_step left at 1): it steps every micro-batch;
- FSDP2 left without gradient sync after a window (set_requires_gradient_sync(False) not
  undone): the ranks' shards drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.backends.runs import (
    STEPS,
    Run,
    assert_ranks_consistent,
    assert_same_norms,
    assert_weights_close,
)

GA = ["--ga_steps", "4"]


@pytest.mark.parametrize("name", ["single", "torch", "fsdp", "deepspeed-zero2",
                                  "deepspeed-zero3", "horovod"])
def test_ga_steps_4_equals_one_batch(name: str, trained: Callable[..., Run]) -> None:
    reference, run = trained(name, "fp32"), trained(name, "fp32", *GA)
    if name != "single":
        assert_ranks_consistent(name, run.text)
        assert "global batch 16 = 2 per rank x 4 micro-batches x 2 ranks" in run.text
    else:
        assert "batch 16 = 4 micro-batches of 4" in run.text
    assert run.payload["step"] == STEPS
    assert [r["step"] for r in run.metrics] == list(range(1, STEPS + 1))
    assert all(r["samples_per_s"] > 0 for r in run.metrics)
    assert [r["loss"] for r in run.metrics] == pytest.approx(reference.losses, rel=1e-4)
    assert_same_norms(run.grad_norms, reference.grad_norms)
    assert_weights_close(run.payload["weights"], reference.payload["weights"])
