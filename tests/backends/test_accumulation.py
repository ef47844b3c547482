"""--ga_steps on every backend: an optimizer step of 4 micro-batches equals one of the whole
batch.

With the same global batch (16: 2 ranks x 4 micro-batches x 2 samples against 1 process x
16), each step sees the same 16 samples (one DistributedSampler; a rank's micro-batches
are consecutive slices of its share), so after 5 steps the weights must agree with the
one-process --ga_steps 1 run to the tolerances of the rank-equivalence tests, and so must
every step's loss and pre-clip gradient norm.

The runs are tests/backends/test_sharing.py's (shared layers, tied embeddings, every block
checkpointed; tests/backends/conftest.py, shared_ga_run): one launch per backend proves
both, and a shared module's gradient must add up over the micro-batches as well.

What would fail:
- a micro-batch's loss not divided by --ga_steps: the gradient and its logged norm are 4x
  (clipping and Adam would hide it from the weights; the norm does not);
- a step counted per micro-batch (DeepSpeed's old meaning): 20 steps in the checkpoint, 20
  metrics lines, and the LR schedule and save/log/sample intervals running 4x faster; or
  in the log's headline only ("1 epochs of 20 steps", while the progress bar counts 5);
- Horovod all-reducing each micro-batch's gradient as if it were a step
  (backward_passes_per_step left at 1): it steps every micro-batch;
- FSDP2 left without gradient sync after a window (set_requires_gradient_sync(False) not
  undone): the ranks' shards drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.backends.runs import (
    SHARED,
    STEPS,
    Run,
    assert_ranks_consistent,
    assert_same_norms,
    assert_weights_close,
)


@pytest.mark.parametrize("name", ["single", "torch", "fsdp", "deepspeed-zero1",
                                  "deepspeed-zero2", "deepspeed-zero3", "horovod"])
def test_ga_steps_4_equals_one_batch(name: str, trained: Callable[..., Run],
                                     shared_ga_run: Callable[[str], Run]) -> None:
    reference, run = trained("single", "fp32", *SHARED), shared_ga_run(name)
    if name != "single":
        assert_ranks_consistent(name, run.text)
        assert (f"1 epochs of {STEPS} steps at global batch 16 = 2 per rank x 4 "
                "micro-batches x 2 ranks") in run.text
    else:
        assert f"1 epochs of {STEPS} steps at batch 16 = 4 micro-batches of 4" in run.text
    assert run.payload["step"] == STEPS
    assert [r["step"] for r in run.metrics] == list(range(1, STEPS + 1))
    assert all(r["samples_per_s"] > 0 for r in run.metrics)
    assert [r["loss"] for r in run.metrics] == pytest.approx(reference.losses, rel=1e-4)
    assert_same_norms(run.grad_norms, reference.grad_norms)
    assert_weights_close(run.payload["weights"], reference.payload["weights"])
