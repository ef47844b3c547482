"""FlexAttention: dropout is never dropped silently, and layers share one compiled kernel
and one block mask per (pattern, layout, device), whatever the sequence's length.

FlexAttention's forward runs on CPU in this torch (no backward). The kernel's structure
(what is shared, what compiles how often) does not depend on the torch.compile backend,
so these tests compile with dynamo's "eager" backend (about a second a graph) instead of
inductor (half a minute a graph on this CPU); the GPU acceptance run counts inductor's
compiles through the same counter (`flex_compile_stats`).
"""

from __future__ import annotations

import pytest
import torch

from dalle_dist.errors import ConfigError
from dalle_dist.model import attention_paths as paths
from dalle_dist.model.attention import Attention, resolve_impl
from dalle_dist.model.patterns import PATTERNS, SequenceLayout
from tests.model.test_attention import (
    CASES,
    DIM,
    DIM_HEAD,
    HEADS,
    TOL,
    brute_mask,
    case_id,
    layouts_for,
    make_layer,
    make_pattern,
    reference,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# The eager backend runs flex unfused, which torch says once per process.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def eager_kernel(monkeypatch: pytest.MonkeyPatch) -> paths.FlexKernel:
    """A fresh shared kernel compiled with the eager backend, standing in for the process's
    one (inductor) kernel for this test."""
    kernel = paths.FlexKernel(backend="eager")
    monkeypatch.setattr(paths, "flex_kernel", lambda: kernel)
    return kernel


# -- dropout ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PATTERNS))
def test_auto_takes_flex_on_cuda_only_without_dropout(name: str) -> None:
    """Bug caught: auto sending a training layer with dropout to flex (issue 13: FlexPath
    dropped --attn_dropout silently on CUDA). In eval (rate 0) flex stays for sampling."""
    pattern = make_pattern(name, {})
    for side in (8, 32):
        layout = SequenceLayout(9, side)
        without = resolve_impl("auto", pattern, CUDA, layout, dropout=0.0)
        with_dropout = resolve_impl("auto", pattern, CUDA, layout, dropout=0.1)
        assert without == ("sdpa" if pattern.causal_only else "flex"), (name, side)
        # Fused paths that apply dropout inside SDPA (not the CPU's band matmuls).
        assert with_dropout in ("sdpa", "gather"), (name, side)
        # On the CPU, dropout changes nothing: every CPU path applies it.
        assert (resolve_impl("auto", pattern, CPU, layout, dropout=0.1)
                == resolve_impl("auto", pattern, CPU, layout, dropout=0.0))


@pytest.mark.parametrize("name", list(PATTERNS))
def test_explicit_flex_with_dropout_is_a_user_error(name: str) -> None:
    """Bug caught: --attn_impl flex training with dropout on, without a word."""
    pattern = make_pattern(name, {})
    layout = SequenceLayout(9, 6)
    assert resolve_impl("flex", pattern, CUDA, layout, dropout=0.0) == "flex"
    with pytest.raises(ConfigError, match="--attn_impl flex cannot apply --attn_dropout"):
        resolve_impl("flex", pattern, CUDA, layout, dropout=0.1)
    q = torch.zeros(1, 1, layout.seq_len, 4)
    with pytest.raises(ConfigError, match="--attn_dropout 0, or use --attn_impl auto"):
        paths.flex(q, q, q, layout, 0.1, pattern)


def dropout_layer(name: str, kw: dict, impl: str, dropout: float) -> Attention:
    layer = make_layer(make_pattern(name, kw), impl)
    layer.dropout = dropout
    return layer.train()


@pytest.mark.parametrize("impl", ["dense", "sdpa", "gather"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_path_but_flex_applies_dropout(case: tuple[str, dict], impl: str) -> None:
    """The paths auto may take while dropout is on (the test above: never flex) all apply
    it. Bugs caught: a path that ignores dropout (rate 1 must zero every attention output,
    leaving only to_out's bias), that forgets the 1/(1-p) rescale or drops scores instead
    of probabilities (the mean over many draws must be the dropout-free output), or that
    drops in eval."""
    name, kw = case
    layout = layouts_for(name)[-1]
    x = torch.randn(1, layout.seq_len, DIM, dtype=torch.float64)

    layer = dropout_layer(name, kw, impl, 1.0)
    with torch.no_grad():
        out = layer(x, layout)
    bias = layer.to_out.bias
    torch.testing.assert_close(out, bias.expand_as(out), atol=1e-12, rtol=0)

    layer = dropout_layer(name, kw, impl, 0.5)
    draws = 600  # one independent mask per batch row
    with torch.no_grad():
        dropped = layer(x.expand(draws, -1, -1), layout) - bias
        clean = layer.eval()(x, layout)[0] - bias
        assert torch.equal(layer(x, layout)[0] - bias, clean)  # eval: no dropout
    assert (dropped[0] - clean).abs().max() > 1e-3  # training: some dropout
    # Measured: at most 0.03 of the largest output; without the rescale it is 0.5.
    err = (dropped.mean(0) - clean).abs().max()
    assert err < 0.1 * clean.abs().max(), float(err / clean.abs().max())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_masked_sdpa_drops_what_the_reference_drops(case: tuple[str, dict]) -> None:
    """Under one seed the masked SDPA path draws the same dropout mask as the einsum
    reference, so with dropout on they agree exactly. Bug caught: the sdpa path passing
    no dropout_p (or another rate)."""
    name, kw = case
    layout = layouts_for(name)[-1]
    x = torch.randn(2, layout.seq_len, DIM, dtype=torch.float64)
    outs = []
    for impl in ("dense", "sdpa"):
        layer = make_layer(make_pattern(name, kw), impl)
        layer.dropout = 0.3
        torch.manual_seed(7)
        outs.append(layer.train()(x, layout))
    torch.testing.assert_close(outs[0], outs[1], atol=TOL, rtol=0)


# -- one kernel, one mask per (pattern, layout, device) --------------------------------

def test_one_process_kernel_created_lazily() -> None:
    """Bug caught: a kernel (and its compile cache) per layer, or compiling at import."""
    kernel = paths.flex_kernel()
    assert kernel is paths.flex_kernel()
    assert kernel.backend == "inductor"
    stats = paths.flex_compile_stats()
    assert set(stats) == {"compiles", "pairs", "signatures", "block_masks", "recompile_limit"}
    if stats["signatures"] == 0:  # nothing called flex in this process yet
        assert kernel._compiled is None and stats["compiles"] == 0


def test_mask_mods_and_block_masks_are_built_once_per_pattern_shape_device() -> None:
    """Bugs caught: a fresh mask_mod closure or BlockMask per layer (a pattern instance is
    built per layer), a cache that ignores the shape (a 22-token mask reused for 83
    tokens), or that ignores a pattern's knobs (conv 3x3 sharing conv 5x5's mask)."""
    kernel = paths.FlexKernel(backend="eager")
    layout = SequenceLayout(9, 6)
    a, b = make_pattern("axial_row", {}), make_pattern("axial_row", {})
    assert a is not b
    assert kernel.mask_mod(a, layout, CPU) is kernel.mask_mod(b, layout, CPU)
    n = layout.seq_len
    assert kernel.block_mask(a, layout, n, CPU) is kernel.block_mask(b, layout, n, CPU)
    assert kernel.block_mask(a, layout, n - 3, CPU) is not kernel.block_mask(a, layout, n, CPU)
    assert kernel.block_mask(a, layout, n - 3, CPU).shape[-2:] == (n - 3, n - 3)
    conv3, conv5 = make_pattern("conv_like", {"kernel": 3}), make_pattern("conv_like", {})
    assert kernel.mask_mod(conv3, layout, CPU) is not kernel.mask_mod(conv5, layout, CPU)
    other = SequenceLayout(5, 3)
    assert kernel.mask_mod(a, layout, CPU) is not kernel.mask_mod(a, other, CPU)
    assert kernel.stats()["block_masks"] == 2


def test_flex_forward_equals_the_reference_for_every_pattern() -> None:
    """One kernel for every case, as a model with mixed patterns has: each must get its own
    pattern's mask (forward only: FlexAttention has no backward on CPU)."""
    kernel = paths.FlexKernel(backend="eager")
    for name, kw in CASES:
        layout = layouts_for(name)[-1]
        pattern = make_pattern(name, kw)
        for n in (layout.seq_len,):  # others: test_every_length_of_a_layout_compiles_once
            q, k, v = (torch.randn(2, HEADS, n, DIM_HEAD, dtype=torch.float64)
                       for _ in range(3))
            out = paths.flex(q, k, v, layout, 0.0, pattern, kernel)
            mask = brute_mask(name, kw, layout, n)
            ref = paths.dense_reference(q, k, v, mask)
            torch.testing.assert_close(out, ref, atol=TOL, rtol=0, msg=f"{name} {kw} {n}")


def test_layers_share_the_compiled_kernel_and_compile_once_per_pattern(
        eager_kernel: paths.FlexKernel) -> None:
    """Four layers, two patterns, through Attention as the model calls it: two graphs,
    two masks, outputs equal to the reference; a second pass compiles nothing. Bugs
    caught: a kernel or a compile per layer (more compiles, or none counted here), a
    recompile per layer from per-layer mask_mods."""
    layout = SequenceLayout(9, 6)
    names = ["axial_row", "conv_like", "axial_row", "conv_like"]
    layers = [make_layer(make_pattern(name, {}), "flex", seed=i).eval()
              for i, name in enumerate(names)]
    x = torch.randn(2, layout.seq_len, DIM, dtype=torch.float64)
    for _ in range(2):
        for name, layer in zip(names, layers, strict=True):
            with torch.no_grad():
                out = layer(x, layout)
                ref = reference(layer, x, brute_mask(name, {}, layout, layout.seq_len))
            torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    stats = eager_kernel.stats()
    assert stats["compiles"] == 2 == stats["pairs"] == stats["signatures"], stats
    assert stats["block_masks"] == 2, stats


def test_every_length_of_a_layout_compiles_once(eager_kernel: paths.FlexKernel) -> None:
    """Uncached sampling feeds the layer every length up to the whole sequence, each to
    the same layout: one graph and one BlockMask for all of them, outputs equal to the
    reference at each length (issue 24 item 8: one compile per length, the kernel being
    static-shaped and its mask built per length). A new batch size compiles once more:
    compiles stay at most the (pattern, shape) pairs, the bound the GPU acceptance run
    asserts."""
    name = "axial_col"
    layout = SequenceLayout(9, 6)
    layer = make_layer(make_pattern(name, {}), "flex").eval()
    for n in (layout.seq_len, layout.text_len + 4, layout.text_len - 1, layout.seq_len - 1):
        x = torch.randn(2, n, DIM, dtype=torch.float64)
        with torch.no_grad():
            out = layer(x, layout)
            ref = reference(layer, x, brute_mask(name, {}, layout, n))
        torch.testing.assert_close(out, ref, atol=TOL, rtol=0, msg=str(n))
    stats = eager_kernel.stats()
    assert stats["compiles"] == stats["pairs"] == stats["block_masks"] == 1, stats
    with torch.no_grad():
        layer(torch.randn(1, layout.text_len + 2, DIM, dtype=torch.float64), layout)
    stats = eager_kernel.stats()
    assert stats["compiles"] == stats["pairs"] == 2 and stats["block_masks"] == 1, stats


def test_more_graphs_than_dynamos_default_limit_still_compile(
        eager_kernel: paths.FlexKernel) -> None:
    """Dynamo keeps 8 graphs per code object by default; 4 patterns x train/eval x 2
    dtypes reach that. Bug caught: the kernel not lifting the limit for flex (the 9th
    graph would run unfused, uncounted; with fullgraph it would raise mid-run)."""
    pattern = make_pattern("axial_row", {})
    layouts = [SequenceLayout(text, 6) for text in range(1, 11)]  # 10 shapes (the lengths
    for layout in layouts:  # of one layout would share a graph)
        q = torch.randn(1, 1, layout.seq_len, DIM_HEAD)
        paths.flex(q, q, q, layout, 0.0, pattern)
    stats = eager_kernel.stats()
    assert stats["compiles"] == stats["signatures"] == len(layouts) > 8, stats
    # A compiled shape again, under autocast: dynamo's global-state guard misses, so this
    # is one more graph, and it too must compile past the default limit. Bug caught (the
    # GPU acceptance run's flex check): a signature blind to autocast, taken for a graph
    # already built, called without the lifted limit and run unfused.
    q = torch.randn(1, 1, layouts[0].seq_len, DIM_HEAD)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        paths.flex(q, q, q, layouts[0], 0.0, pattern)
    assert eager_kernel.stats()["compiles"] == len(layouts) + 1, eager_kernel.stats()
