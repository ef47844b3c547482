"""Attention patterns against their definitions, and every path against the dense reference.

The definitions here are written independently of dalle_dist, in plain Python loops, from
the issue's wording (and DeepSpeed's VariableSparsityConfig for `sparse`). Every path the
layer can take (dense, sdpa, gather; FlexAttention on CUDA) must equal masked attention
built from these definitions, outputs and gradients; the KV cache must equal one shot;
and no output may depend on a later token. Everything runs in float64, where the paths
differ only by summation order: tolerance 1e-10.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from dalle_dist.errors import ConfigError
from dalle_dist.model.attention import ATTN_IMPLS, Attention, resolve_impl
from dalle_dist.model.patterns import (
    PATTERNS,
    AttentionPattern,
    PatternOptions,
    SequenceLayout,
    build_pattern,
)

TOL = 1e-10
DIM, HEADS, DIM_HEAD = 12, 3, 4


def brute_allowed(name: str, layout: SequenceLayout, q: int, k: int, kernel: int = 5,
                  dilation: int = 1, random_blocks: int = 2, seed: int = 0) -> bool:
    """The definitions, one pair of positions at a time."""
    if k > q:
        return False
    if name == "sparse":
        block = 16
        bq, bk = q // block, k // block
        is_global = bk < math.ceil(layout.text_len / block)
        is_local = bq // 4 == bk // 4
        rng = random.Random(seed)
        picks: set[int] = set()
        for row in range(bq + 1):
            chosen = rng.sample(range(row + 1), min(random_blocks, row + 1))
            if row == bq:
                picks = set(chosen)
        return is_global or is_local or bk in picks
    text = layout.text_len
    if k < text:
        return True  # every query sees the earlier text
    jq, jk = q - text, k - text
    (rq, cq), (rk, ck) = divmod(jq, layout.fmap_size), divmod(jk, layout.fmap_size)
    if name == "full":
        return True
    if name == "axial_row":
        return rq == rk
    if name == "axial_col":
        return cq == ck
    # DALLE-pytorch 1.6.6's window: k x k cells (dilated) ending at the query, up and left
    reach = (kernel - 1) * dilation
    return (0 <= rq - rk <= reach and 0 <= cq - ck <= reach
            and (rq - rk) % dilation == 0 and (cq - ck) % dilation == 0)


CASES = [
    ("full", {}), ("axial_row", {}), ("axial_col", {}),
    ("conv_like", {"kernel": 3, "dilation": 1}), ("conv_like", {"kernel": 5, "dilation": 2}),
    ("sparse", {"random_blocks": 0}), ("sparse", {"random_blocks": 2, "seed": 3}),
]
LAYOUTS = [SequenceLayout(5, 3), SequenceLayout(9, 6)]
SPARSE_LAYOUT = SequenceLayout(20, 8)  # 83 positions: six 16-token blocks


def case_id(case: tuple[str, dict]) -> str:
    return case[0] + "".join(f"-{k}{v}" for k, v in case[1].items())


def make_pattern(name: str, kw: dict) -> AttentionPattern:
    return build_pattern(name, PatternOptions(
        conv_kernel_size=kw.get("kernel", 5), conv_dilation=kw.get("dilation", 1),
        sparse_random_blocks=kw.get("random_blocks", 2), sparse_seed=kw.get("seed", 0)))


def layouts_for(name: str) -> list[SequenceLayout]:
    return [SPARSE_LAYOUT] if name == "sparse" else LAYOUTS


def brute_mask(name: str, kw: dict, layout: SequenceLayout, n: int) -> Tensor:
    return torch.tensor([[brute_allowed(name, layout, q, k, **kw) for k in range(n)]
                         for q in range(n)])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_attended_sets_match_the_definitions(case: tuple[str, dict]) -> None:
    name, kw = case
    for layout in layouts_for(name):
        got = make_pattern(name, kw).full_mask(layout, layout.seq_len, torch.device("cpu"))
        expected = brute_mask(name, kw, layout, layout.seq_len)
        assert torch.equal(got, expected), (name, kw, layout)


def test_every_pattern_lets_text_see_earlier_text_only() -> None:
    layout = SequenceLayout(20, 8)
    for name in PATTERNS:
        mask = make_pattern(name, {}).full_mask(layout, layout.seq_len, torch.device("cpu"))
        text = layout.text_len
        assert torch.equal(mask[:text, :text], torch.ones(text, text).tril().bool()), name
        assert not mask[:text, text:].any(), name


def reference(layer: Attention, x: Tensor, mask: Tensor) -> Tensor:
    """Textbook masked attention on the layer's own projections."""
    b, n, _ = x.shape
    q, k, v = layer.to_qkv(x).view(b, n, 3, HEADS, DIM_HEAD).permute(2, 0, 3, 1, 4)
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(DIM_HEAD)
    out = torch.einsum("bhij,bhjd->bhid", scores.masked_fill(~mask, -math.inf).softmax(-1), v)
    return layer.to_out(out.transpose(1, 2).reshape(b, n, -1))


def make_layer(pattern: AttentionPattern, impl: str, seed: int = 0) -> Attention:
    torch.manual_seed(seed)
    layer = Attention(DIM, HEADS, DIM_HEAD, 0.0, pattern, impl).double()
    torch.nn.init.normal_(layer.to_out.bias)
    return layer


IMPLS = ["dense", "sdpa", "gather", "matmul"] + (["flex"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_path_equals_the_reference(case: tuple[str, dict], impl: str) -> None:
    name, kw = case
    for layout in layouts_for(name):
        # The whole training sequence, and shorter prefixes as uncached sampling feeds.
        for n in (layout.seq_len, layout.text_len + 2, layout.text_len - 1):
            layer = make_layer(make_pattern(name, kw), impl)
            x = torch.randn(2, n, DIM, dtype=torch.float64, requires_grad=True)
            upstream = torch.randn(2, n, DIM, dtype=torch.float64)
            out = layer(x, layout)
            grads = torch.autograd.grad((out * upstream).sum(), [x, *layer.parameters()])
            ref = reference(layer, x, brute_mask(name, kw, layout, n))
            ref_grads = torch.autograd.grad((ref * upstream).sum(), [x, *layer.parameters()])
            torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
            for got, expected in zip(grads, ref_grads, strict=True):
                torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_no_output_depends_on_a_later_token(case: tuple[str, dict], impl: str) -> None:
    name, kw = case
    layout = layouts_for(name)[-1]
    layer = make_layer(make_pattern(name, kw), impl).eval()
    x = torch.randn(1, layout.seq_len, DIM, dtype=torch.float64)
    allowed = brute_mask(name, kw, layout, layout.seq_len)
    for j in (layout.text_len - 1, layout.text_len + 3, layout.seq_len - 2):
        changed = x.clone()
        changed[:, j] += 1.0
        with torch.no_grad():
            a, b = layer(x, layout), layer(changed, layout)
        torch.testing.assert_close(a[:, :j], b[:, :j], atol=TOL, rtol=0)
        moved = (a - b).abs().amax(dim=-1)[0] > 1e-9
        # Exactly the queries allowed to see j move (j itself always does).
        assert torch.equal(moved[j:], allowed[j:, j]), (name, j)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kv_cache_equals_one_shot(case: tuple[str, dict]) -> None:
    """Sampling feeds the prefix, then one token at a time; odd chunks must agree too."""
    name, kw = case
    layout = layouts_for(name)[-1]
    n = layout.seq_len
    layer = make_layer(make_pattern(name, kw), "dense", seed=1).eval()
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    for chunks in ([layout.text_len] + [1] * (n - layout.text_len), [7, 3] * n):
        with torch.no_grad():
            one_shot = layer(x, layout)
            cache = layer.new_cache(2, layout, x.device, x.dtype)
            pieces, start = [], 0
            for size in chunks:
                if start >= n:
                    break
                positions = torch.arange(start, min(start + size, n))
                pieces.append(layer(x[:, start:start + size], layout, cache, positions))
                start += size
        torch.testing.assert_close(torch.cat(pieces, dim=1), one_shot, atol=TOL, rtol=0)


def test_flex_mask_mod_is_the_same_rule() -> None:
    """FlexAttention's mask_mod (the one the shared kernel builds) comes from the same rule
    through vmap; materialising that mask on CPU must give the dense mask."""
    from torch.nn.attention.flex_attention import create_mask

    from dalle_dist.model.attention_paths import FlexKernel

    kernel = FlexKernel()
    for name, kw in CASES:
        layout = layouts_for(name)[-1]
        n = layout.seq_len
        mask_mod = kernel.mask_mod(make_pattern(name, kw), layout, torch.device("cpu"))
        got = create_mask(mask_mod, None, None, n, n, device="cpu")[0, 0]
        assert torch.equal(got, brute_mask(name, kw, layout, n)), name


def test_unknown_pattern_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        build_pattern("nope")
    assert "'nope'" in str(info.value)
    for name in PATTERNS:
        assert name in str(info.value)


def test_auto_picks_a_path_per_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_impl("auto", build_pattern("full"), cpu) == "sdpa"
    for name, side in (("axial_row", 12), ("axial_col", 12), ("conv_like", 16)):
        below, at = SequenceLayout(33, side - 1), SequenceLayout(33, side)
        assert resolve_impl("auto", build_pattern(name), cpu, below) == "sdpa", name
        assert resolve_impl("auto", build_pattern(name), cpu, at) == "matmul", name
        # On CUDA with dropout (no flex): the fused gather, never the CPU's matmuls.
        assert resolve_impl("auto", build_pattern(name), cuda, at, 0.1) in ("gather", "sdpa")
    assert resolve_impl("auto", build_pattern("axial_row"), cuda, SequenceLayout(33, 8),
                        0.1) == "gather"
    assert resolve_impl("auto", build_pattern("sparse"), cpu) == "sdpa"
    assert resolve_impl("auto", build_pattern("sparse"), cuda) == "flex"
    assert resolve_impl("gather", build_pattern("full"), cpu) == "sdpa"
    # matmul on a pattern without a band: that pattern's own choice.
    assert resolve_impl("matmul", build_pattern("full"), cpu) == "sdpa"
    assert resolve_impl("matmul", build_pattern("sparse"), cuda) == "flex"
    with pytest.raises(ConfigError, match="valid: " + ", ".join(ATTN_IMPLS)):
        resolve_impl("fast", build_pattern("full"), cpu)


@pytest.mark.parametrize(("options", "flag"), [
    (PatternOptions(conv_kernel_size=4), "--conv_kernel_size"),
    (PatternOptions(conv_dilation=0), "--conv_dilation"),
    (PatternOptions(sparse_random_blocks=-1), "--sparse_random_blocks"),
])
def test_bad_pattern_options(options: PatternOptions, flag: str) -> None:
    name = "sparse" if flag == "--sparse_random_blocks" else "conv_like"
    with pytest.raises(ConfigError, match=flag):
        build_pattern(name, options)


def test_stable_softmax_is_softmax_computed_differently() -> None:
    """DALLE-pytorch's stable form must not change the result, only its fp16 range."""
    from dalle_dist.model.attention_paths import softmax

    scores = torch.randn(4, 7, dtype=torch.float64) * 50
    torch.testing.assert_close(softmax(scores, stable=True), scores.softmax(-1),
                               atol=1e-12, rtol=0)
    layer = make_layer(make_pattern("conv_like", {}), "dense")
    layer.stable = True
    layout = LAYOUTS[-1]
    x = torch.randn(2, layout.seq_len, DIM, dtype=torch.float64)
    ref = reference(layer, x, brute_mask("conv_like", {}, layout, layout.seq_len))
    torch.testing.assert_close(layer(x, layout), ref, atol=TOL, rtol=0)


# -- the gather paths reach SDPA's fused kernels (issue 24 item 8) ---------------------

GATHER_CASES = [("axial_row", {}), ("axial_col", {}), ("conv_like", {"kernel": 3}),
                ("sparse", {"random_blocks": 2})]


class AttentionKernels(TorchDispatchMode):
    """Records the attention kernels a forward reaches, as aten ops (after SDPA chose):
    the CPU's fused flash kernel with its q, k, v and mask shapes, and the ops SDPA's
    math path decomposes into (bmm, softmax), which no other part of a layer runs."""

    FUSED = "_scaled_dot_product_flash_attention_for_cpu"
    MATH = frozenset({"bmm", "_softmax", "softmax"})

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[tuple[list[int], torch.Size | None]] = []
        self.math: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name == self.FUSED:
            mask = (kwargs or {}).get("attn_mask")
            self.fused.append(([t.dim() for t in args[:3]],
                               None if mask is None else mask.shape))
        elif name in self.MATH:
            self.math.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", GATHER_CASES, ids=case_id)
def test_gather_paths_call_sdpa_with_4d_tensors(case: tuple[str, dict]) -> None:
    """SDPA's fused kernels (flash, memory-efficient, CPU flash) take [b, h, n, d] only;
    5-D inputs go to its math path, upcast to fp32. Bug caught: the band gather batching
    its grid lines as a fifth dimension (then the band's attention shows up as bmm and
    softmax, not as the fused kernel). An axial band passes no mask of its own: a
    lower-right CausalBias, which the CPU kernel receives as one [line, keys] mask (a
    band mask would be per line and head)."""
    name, kw = case
    layout = layouts_for(name)[-1]
    layer = make_layer(make_pattern(name, kw), "gather")
    x = torch.randn(2, layout.seq_len, DIM, dtype=torch.float64)
    kernels = AttentionKernels()
    with kernels:
        out = layer(x, layout)
    assert kernels.fused and kernels.math == [], (kernels.fused, kernels.math)
    assert all(dims == [4, 4, 4] for dims, _ in kernels.fused), kernels.fused
    assert all(m is None or len(m) <= 4 for _, m in kernels.fused)
    if name.startswith("axial"):
        s = layout.fmap_size
        assert (torch.Size([s, layout.text_len + s])
                in [m for _, m in kernels.fused]), kernels.fused
    torch.testing.assert_close(  # still the pattern (every path: the test above)
        out, reference(layer, x, brute_mask(name, kw, layout, layout.seq_len)),
        atol=TOL, rtol=0)


class DeviceReads(TorchDispatchMode):
    """Records the aten ops after which the host waits for the device: a scalar read
    (.item(), int(), bool(), .tolist() all end in _local_scalar_dense) and the ops whose
    output shape depends on values (nonzero, masked_select, unique)."""

    OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2",
                     "unique_dim", "unique_consecutive", "item"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket.__name__ in self.OPS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_sparse_gather_forward_reads_no_device_value() -> None:
    """Bug caught: block_gather reading its gather width off a device tensor (an int()
    of a sum, one host sync per sparse layer per step). The key-block index is built once
    per layout, on the host; a forward, at any length, then reads nothing."""
    name, kw = "sparse", {"random_blocks": 2}
    layout = SPARSE_LAYOUT
    layer = make_layer(make_pattern(name, kw), "gather")
    x = torch.randn(1, layout.seq_len, DIM, dtype=torch.float64)
    layer(x, layout)  # builds the index
    for n in (layout.seq_len, layout.text_len + 2):
        probe = DeviceReads()
        with probe:
            out = layer(x[:, :n], layout)
        assert probe.seen == [], probe.seen
        torch.testing.assert_close(out, reference(layer, x[:, :n],
                                                  brute_mask(name, kw, layout, n)),
                                   atol=TOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gathered_rows_sum_their_gradients_in_fp32(dtype: torch.dtype) -> None:
    """The sparse gather path picks block 0 once per query block. In bf16 on CUDA,
    autograd's index_add_ adds those gradients one rounded atomic after another: the GPU
    acceptance run measured the path's bf16 gradients 3.5x further from the fp32 reference
    than the dense path's (`attention sparse bf16`, the check that catches it there; the
    CPU's index_add_ already sums in fp32, so this test cannot show it here). Bugs caught
    in the replacement backward: repeats overwriting instead of adding (index_copy_), rows
    nothing picked not zero, a forward that is not index_select."""
    from dalle_dist.model.attention_paths import gather_rows

    torch.manual_seed(0)
    rows, width = 6, 40
    ids = torch.cat([torch.zeros(width, dtype=torch.long), torch.tensor([1, 2, 2, 4, 1])])
    t = torch.randn(rows, 3, 8, dtype=dtype, requires_grad=True)
    grad = torch.randn(len(ids), 3, 8).to(dtype)
    out = gather_rows(t, ids)
    assert torch.equal(out, t.detach().index_select(0, ids))
    out.backward(grad)
    exact = torch.zeros(rows, 3, 8, dtype=torch.float64).index_add_(0, ids, grad.double())
    assert t.grad.dtype == dtype
    if dtype == torch.float32:  # autograd's own path, summing in fp32
        torch.testing.assert_close(t.grad, exact.float(), rtol=1e-6, atol=1e-6)
    else:  # summed exactly enough to round once
        assert torch.equal(t.grad, exact.to(dtype)), (t.grad.float() - exact).abs().max()
    assert not t.grad[[3, 5]].any()  # picked by nothing
