"""Sampling with the DALL-E's weights cast to bf16 or fp16 (`generate --precision`).

Decoding one token at a time is bound by reading the weights, so the cast is what makes it
faster; what must still hold once the model is cast:
- every matmul of the decode step is in the cast dtype (a step that upcast its input would
  read and compute the fp32 bytes the flag is meant to halve); the cache keeps that dtype
  on CUDA and fp32 on the CPU, whose half-precision attention kernels are slow
  (decoding.cache_dtype);
- cached decoding equals the uncached forward of the same cast model, step by step, up to
  that dtype's rounding: the fp32 tests' token-for-token equality cannot hold in half
  precision (a near tie in the Gumbel argmax flips with the summation order), so the
  teacher-forced logits are compared instead, against a tolerance set from the dtype's
  epsilon that a cache missing one position exceeds fivefold.
Every attention pattern and the rotary / shift options take part, as in the fp32 tests.
"""

from __future__ import annotations

import pytest
import torch

from dalle_dist.backends.precision import matmul_dtypes
from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.decoding import StaticDecoder, cache_dtype, teacher_forced_logits

DTYPES = [torch.float16, torch.bfloat16]
PATTERNS = ("full", "axial_row", "axial_col", "conv_like", "sparse")


def cast_model(dtype: torch.dtype, rotary_shift: bool) -> DALLE:
    torch.manual_seed(0)
    config = DALLEConfig(num_text_tokens=100, text_seq_len=8, num_image_tokens=64,
                         image_fmap_size=4, dim=64, depth=len(PATTERNS), heads=2, dim_head=32,
                         attn_types=PATTERNS, rotary_emb=rotary_shift,
                         shift_tokens=rotary_shift)
    model = DALLE(config).eval()
    for p in model.parameters():  # std 0.3: logits spread over units, not hundredths
        torch.nn.init.normal_(p, std=0.3)
    return model.to(dtype)


def tolerance(dtype: torch.dtype, scale: float) -> float:
    """Four roundings of the dtype at the logits' scale. Measured max |cached - uncached|
    / scale: fp16 0.0013-0.0014 (tolerance 0.0039), bf16 0.0096-0.0154 (0.031); with a
    cache that misses one position, 0.18-0.19 in both."""
    return 4 * torch.finfo(dtype).eps * scale


@pytest.mark.parametrize("rotary_shift", [False, True], ids=["plain", "rotary_shift"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@torch.no_grad()
def test_cached_decoding_of_a_cast_model_equals_its_uncached_forward(
        dtype: torch.dtype, rotary_shift: bool) -> None:
    model = cast_model(dtype, rotary_shift)
    text = torch.randint(1, 100, (3, 8), generator=torch.Generator().manual_seed(1))
    tokens = model.sample_image_tokens(text, 0.5, 1.0, torch.Generator().manual_seed(2))
    cached, uncached = teacher_forced_logits(model, text, tokens)
    assert torch.isfinite(cached).all()
    scale = uncached.abs().amax().item()
    assert scale > 1.0  # logits spread wide enough for a rounding tolerance to mean something
    assert (cached - uncached).abs().amax().item() < tolerance(dtype, scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@torch.no_grad()
def test_the_tolerance_catches_a_cache_that_misses_a_position(dtype: torch.dtype) -> None:
    """The comparison above fails when one decode step's key and value never reach the
    cache (its tokens then vanish from every later step): the tolerance is not so loose
    that a wrong cache passes."""
    model = cast_model(dtype, False)
    text = torch.randint(1, 100, (3, 8), generator=torch.Generator().manual_seed(1))
    tokens = model.sample_image_tokens(text, 0.5, 1.0, torch.Generator().manual_seed(2))
    decoder = StaticDecoder(model, 3)
    model.prefill(text, decoder.caches)
    worst = 0.0
    for j in range(tokens.shape[1] - 1):
        saved = [(c.k.clone(), c.v.clone()) for c in decoder.caches]
        logits = decoder.step(tokens[:, j:j + 1], decoder.cells[j:j + 1]).float()
        if j == 3:  # forget step 3's writes
            for c, (k, v) in zip(decoder.caches, saved, strict=True):
                c.k.copy_(k)
                c.v.copy_(v)
        reference = model.uncached_image_logits(text, tokens[:, :j + 1]).float()
        worst = max(worst, (logits - reference).abs().amax().item())
    scale = model.uncached_image_logits(text, tokens[:, :1]).float().abs().amax().item()
    assert worst > tolerance(dtype, scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@torch.no_grad()
def test_the_decode_step_computes_its_matmuls_in_the_cast_dtype(dtype: torch.dtype) -> None:
    """The weights' bytes are what the cast halves: every linear layer of the step runs in
    the dtype (a step that upcast its input would compute in fp32, or fail on the mixed
    dtypes). On the CPU the cache is fp32 (cache_dtype), so this also checks that nothing
    of the cache's dtype leaks into the layers after attention."""
    model = cast_model(dtype, True)
    decoder = StaticDecoder(model, 2)
    assert {t.dtype for c in decoder.caches for t in (c.k, c.v)} == {torch.float32}
    text = torch.randint(1, 100, (2, 8))
    model.prefill(text, decoder.caches)
    tokens = torch.zeros(2, 1, dtype=torch.long)
    with matmul_dtypes(model) as seen:
        logits = decoder.step(tokens, decoder.cells[:1])
    assert seen == {dtype}
    assert logits.dtype == dtype


def test_the_cache_keeps_half_precision_where_its_attention_is_fast() -> None:
    """CUDA's half-precision attention is native: the cache keeps the weights' dtype there
    (half the bytes). The CPU's is 5-11x slower than fp32 at decode shapes: fp32 there.
    fp32 models keep fp32 everywhere."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    for dtype in DTYPES:
        assert cache_dtype(dtype, cuda) == dtype
        assert cache_dtype(dtype, cpu) == torch.float32
    assert cache_dtype(torch.float32, cuda) == cache_dtype(torch.float32, cpu) == torch.float32
