"""`train --compile`: every attention path that trains on the CPU, compiled by inductor with
2 threads (the suite's processes run 1, and inductor writes other kernels for 1), computes
what it computes eagerly: outputs and gradients, without dropout and with it.

With dropout the comparison uses a dropout that never drops (p = 1e-9: a probability is
dropped only when its uniform draw is at most p): the graph is that of any p > 0 (on the
CPU, SDPA leaves its flash kernel for the math decomposition inductor fuses), yet its
outputs and gradients must equal the eager path's without dropout.

The two torch 2.13 compiler bugs it guards against:
- without dropout, AOTAutograd's donated buffers let conv_like's band matmuls (`matmul`,
  the CPU's path from 16 x 16 cells) overwrite the saved attention probabilities in the
  backward while a view of them was still to be read: the values' gradient came out wrong
  under a right loss. train/compile.py now turns donated buffers off (no_donated_buffers);
- with dropout, inductor fused the band gather's `unfold` backward into a scatter-add that
  wrote past the gradient's end: `train --compile --attn_impl gather --attn_dropout 0.1`
  aborted with a glibc heap error in its second step. The gather now builds its band from
  one slice per line offset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor

from dalle_dist.model import attention_paths as paths
from dalle_dist.model.patterns import SequenceLayout, SparsePattern, build_pattern
from dalle_dist.train.compile import no_donated_buffers

#: small enough to compile quickly, big enough for conv_like's reach and sparse's blocks
LAYOUT = SequenceLayout(text_len=8, fmap_size=4)
BATCH, HEADS, DIM_HEAD = 2, 2, 16
NEVER_DROPS = 1e-9
#: one attention path: (q, k, v, dropout) -> output
Path = Callable[[Tensor, Tensor, Tensor, float], Tensor]


def cpu_paths() -> list[Path]:
    """One call per (path, pattern) that trains on the CPU, each with what its layer builds
    eagerly (masks, block indices, the CausalBias) bound in: a compiled graph only reads
    them."""
    n = LAYOUT.seq_len
    calls: list[Path] = []
    for name in ("axial_row", "axial_col", "conv_like"):
        pattern = build_pattern(name)
        rows_back = pattern.reach if name == "conv_like" else 0
        columns = name == "axial_col"
        causal = (paths.lower_right_causal(LAYOUT.fmap_size, LAYOUT.text_len + LAYOUT.fmap_size)
                  if name != "conv_like" else None)
        hidden = ~paths.band_mask(pattern, LAYOUT, n, rows_back, columns, torch.device("cpu"))
        calls.append(lambda q, k, v, p, pattern=pattern, rows_back=rows_back, columns=columns,
                     causal=causal: paths.band_gather(q, k, v, LAYOUT, p, pattern, rows_back,
                                                      columns, causal))
        calls.append(lambda q, k, v, p, rows_back=rows_back, hidden=hidden, columns=columns:
                     paths.band_scores(q, k, v, LAYOUT, p, rows_back, hidden, columns))
    sparse = build_pattern("sparse")
    assert isinstance(sparse, SparsePattern)
    index = paths.block_index(sparse, LAYOUT, torch.device("cpu"))
    calls.append(lambda q, k, v, p: paths.block_gather(q, k, v, p, sparse, index))
    mask = build_pattern("conv_like").full_mask(LAYOUT, n, torch.device("cpu"))
    calls.append(lambda q, k, v, p: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=p))
    calls.append(lambda q, k, v, p: paths.dense_reference(q, k, v, mask, p))
    return calls


@contextlib.contextmanager
def compiled_as_train_does() -> Iterator[None]:
    """2 threads (inductor writes a parallel kernel only for 2 or more) and
    no_donated_buffers, as `train --compile` sets them; the worker's threads and the two
    settings no_donated_buffers changes are restored for its next tests."""
    import torch._functorch.config

    threads = torch.get_num_threads()
    settings = torch._functorch.config.donated_buffer, torch.compiler.config.cache_key_tag
    torch.set_num_threads(2)
    no_donated_buffers()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch._functorch.config.donated_buffer, torch.compiler.config.cache_key_tag = settings


@pytest.mark.parametrize("dropout", [0.0, NEVER_DROPS], ids=["no-dropout", "dropout"])
def test_every_cpu_path_compiled_equals_eager(dropout: float) -> None:
    """Inductor (the --compile default) as `train --compile` sets it up (no_donated_buffers),
    all paths in one graph (one compile per case, 35 s each with an empty cache): band_gather
    and band_scores for axial_row, axial_col and conv_like, the sparse block gather, masked
    SDPA and the dense reference. Outputs and q, k, v gradients within fp32 rounding of
    eager without dropout. With donated buffers on, the values' gradient differs by up to
    2.7x its size (no-dropout); with the old band gather the process aborts (dropout)."""
    calls = cpu_paths()

    def attend(q: Tensor, k: Tensor, v: Tensor, p: float) -> list[Tensor]:
        return [call(q, k, v, p) for call in calls]

    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, LAYOUT.seq_len, DIM_HEAD) for _ in range(3))
    weights = torch.randn(len(calls), *q.shape)

    def run(fn: Callable[..., list[Tensor]], p: float
            ) -> tuple[list[Tensor], tuple[Tensor, ...]]:
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        outs = fn(*inputs, p)
        loss = sum((out * w).sum() for out, w in zip(outs, weights, strict=True))
        return [out.detach() for out in outs], torch.autograd.grad(loss, inputs)

    torch._dynamo.reset()
    eager_outs, eager_grads = run(attend, 0.0)
    with compiled_as_train_does():
        outs, grads = run(torch.compile(attend, fullgraph=True), dropout)
    for got, expected in zip(outs, eager_outs, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for got, expected, name in zip(grads, eager_grads, "qkv", strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)
