"""`train --compile` with --attn_dropout: every CPU path that applies dropout, compiled by
inductor, computes what it computes eagerly.

A dropout that never drops (p = 1e-9: a probability is dropped only when its uniform draw is
at most p) leaves the compiled graph's shape as with any p > 0 (on the CPU, SDPA then leaves
its flash kernel for the math decomposition inductor fuses), yet its outputs and gradients
must equal the eager path's without dropout. The bug this caught: inductor in torch 2.13
fused the band gather's `unfold` backward into one C++ kernel whose scatter-add wrote at
twice the right stride past the gradient's end. `train --compile --attn_impl gather
--attn_dropout 0.1` then aborted in its second step with a glibc heap error (`double free
or corruption`), or trained on wrong gradients; the gather now builds its band from one
slice per line offset, as the matmul path does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dalle_dist.model import attention_paths as paths
from dalle_dist.model.patterns import SequenceLayout, SparsePattern, build_pattern

#: small enough to compile quickly, big enough for conv_like's reach and sparse's blocks
LAYOUT = SequenceLayout(text_len=8, fmap_size=4)
BATCH, HEADS, DIM_HEAD = 2, 2, 16
NEVER_DROPS = 1e-9


def dropout_paths() -> list:
    """One call per (path, pattern) that applies dropout on the CPU, each with what its
    layer builds eagerly (masks, block indices, the CausalBias) bound in: a compiled graph
    only reads them."""
    n = LAYOUT.seq_len
    calls = []
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


def test_every_dropout_path_compiled_equals_eager() -> None:
    """Inductor (the --compile default), all paths in one graph (one compile, about 20 s
    with an empty cache): band_gather and band_scores for axial_row, axial_col and
    conv_like, the sparse block gather, masked SDPA and the dense reference. Outputs and
    q, k, v gradients within fp32 rounding of eager without dropout; with the old band
    gather the compiled backward corrupted the heap (the process aborts) or its k and v
    gradients were off."""
    calls = dropout_paths()

    def attend(q: Tensor, k: Tensor, v: Tensor, p: float) -> list[Tensor]:
        return [call(q, k, v, p) for call in calls]

    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, LAYOUT.seq_len, DIM_HEAD) for _ in range(3))
    weights = torch.randn(len(calls), *q.shape)

    def run(fn, p: float) -> tuple[list[Tensor], tuple[Tensor, ...]]:  # type: ignore[no-untyped-def]
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        outs = fn(*inputs, p)
        loss = sum((out * w).sum() for out, w in zip(outs, weights, strict=True))
        return [out.detach() for out in outs], torch.autograd.grad(loss, inputs)

    torch._dynamo.reset()
    eager_outs, eager_grads = run(attend, 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # inductor writes a parallel kernel only for 2 threads or more
    try:
        outs, grads = run(torch.compile(attend, fullgraph=True), NEVER_DROPS)
    finally:
        torch.set_num_threads(threads)
    for got, expected in zip(outs, eager_outs, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for got, expected, name in zip(grads, eager_grads, "qkv", strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)
