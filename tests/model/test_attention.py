"""Attention patterns and the attention layer: every fast path equals dense masked attention
(DESIGN.md, "Tests"), and the KV cache used for sampling reproduces the one-shot output."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from dalle_dist.errors import ConfigError
from dalle_dist.model.attention import (
    PATTERNS,
    Attention,
    AttentionPattern,
    FullPattern,
    LayerKVCache,
    SequenceLayout,
    build_pattern,
)

#: float64 throughout; the fast path and the reference differ only by summation order,
#: which in float64 stays many orders of magnitude below this.
TOL = 1e-10

LAYOUT = SequenceLayout(text_len=5, fmap_size=3)  # seq_len = 5 + 9 - 1 = 13
DIM, HEADS, DIM_HEAD = 12, 3, 4


def _layer(pattern: AttentionPattern, seed: int = 0) -> Attention:
    """A float64 attention layer with deterministic weights, in eval mode (no dropout)."""
    torch.manual_seed(seed)
    layer = Attention(DIM, HEADS, DIM_HEAD, dropout=0.0, pattern=pattern).double().eval()
    # Non-zero output bias so a reference that forgot to_out's bias would not match.
    torch.nn.init.normal_(layer.to_out.bias)
    return layer


def _dense_reference(layer: Attention, x: Tensor, layout: SequenceLayout) -> Tensor:
    """Textbook masked attention, written independently of the layer's SDPA call."""
    b, n, _ = x.shape
    qkv = layer.to_qkv(x).view(b, n, 3, layer.heads, layer.dim_head)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [b, h, n, d]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * layer.dim_head**-0.5
    positions = torch.arange(n)
    allowed = layer.pattern.allows(layout, positions, positions)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("bhij,bhjd->bhid", scores.softmax(dim=-1), v)
    return layer.to_out(out.transpose(1, 2).reshape(b, n, -1))


def test_full_pattern_allows_matches_brute_force() -> None:
    n = LAYOUT.seq_len
    positions = torch.arange(n)
    got = FullPattern().allows(LAYOUT, positions, positions)
    expected = [[k <= q for k in range(n)] for q in range(n)]
    assert got.dtype == torch.bool
    assert got.tolist() == expected


def test_full_pattern_allows_offset_queries() -> None:
    """Queries that start mid-sequence (a cache chunk) see keys up to their own position."""
    q_pos = torch.arange(6, 9)
    k_pos = torch.arange(9)
    got = FullPattern().allows(LAYOUT, q_pos, k_pos)
    assert got.tolist() == [[k <= q for k in range(9)] for q in range(6, 9)]


def test_full_pattern_uses_sdpa_causal_kernel_for_whole_sequence() -> None:
    mask, is_causal = FullPattern().sdpa_arguments(LAYOUT, 0, 13, 13, torch.device("cpu"))
    assert mask is None and is_causal


def test_sdpa_equals_dense_reference_outputs_and_gradients() -> None:
    layer = _layer(FullPattern())
    x = torch.randn(2, LAYOUT.seq_len, DIM, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    upstream = torch.randn(2, LAYOUT.seq_len, DIM, dtype=torch.float64)

    out = layer(x, LAYOUT)
    (out * upstream).sum().backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad()

    ref = _dense_reference(layer, x_ref, LAYOUT)
    (ref * upstream).sum().backward()

    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=TOL, rtol=0)
    for name, p in layer.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=TOL, rtol=0, msg=name)


def test_dense_reference_is_causal() -> None:
    """Guards the reference itself: a later token must not move an earlier output."""
    layer = _layer(FullPattern())
    x = torch.randn(1, LAYOUT.seq_len, DIM, dtype=torch.float64)
    changed = x.clone()
    changed[:, 7] += 1.0
    with torch.no_grad():
        a, b = layer(x, LAYOUT), layer(changed, LAYOUT)
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=TOL, rtol=0)
    assert (a[:, 7:] - b[:, 7:]).abs().amax() > 1e-3


@pytest.mark.parametrize("chunks", [[5, 1, 1, 1, 1, 1, 1, 1, 1], [5, 3, 3, 2], [1] * 13])
def test_kv_cache_chunks_equal_one_shot(chunks: list[int]) -> None:
    """[5, 1, ...] is how sampling runs (prefix, then one token); other splits take the
    masked path of sdpa_arguments and must agree too."""
    assert sum(chunks) == LAYOUT.seq_len
    layer = _layer(FullPattern(), seed=1)
    x = torch.randn(2, LAYOUT.seq_len, DIM, dtype=torch.float64)
    with torch.no_grad():
        one_shot = layer(x, LAYOUT)
        cache = LayerKVCache(2, HEADS, LAYOUT.seq_len, DIM_HEAD, x.device, x.dtype)
        pieces, start = [], 0
        for size in chunks:
            pieces.append(layer(x[:, start : start + size], LAYOUT, cache))
            start += size
            assert cache.length == start
    torch.testing.assert_close(torch.cat(pieces, dim=1), one_shot, atol=TOL, rtol=0)


def test_unknown_pattern_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        build_pattern("nope")
    message = str(info.value)
    assert "'nope'" in message
    assert "full" in message
    for name in PATTERNS:
        assert name in message


def test_build_pattern_returns_named_pattern() -> None:
    pattern = build_pattern("full")
    assert isinstance(pattern, FullPattern)
    assert pattern.name == "full"
