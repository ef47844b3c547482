"""The sampling checks of `dalle-dist selftest` (selftest/sampling.py) on a tiny model of
the selftest's kind (untrained, 2 layers): a correct KV cache passes its logits tolerance
in fp32 and in half precision with a half-precision cache (CUDA's layout, built here on
the CPU), and real cache bugs, patched into LayerKVCache.write, fail it.

Measured here (relative RMS difference in eps of the dtype; bound 28 fp32, 5.9 half):
correct fp32 0.95, bf16 0.11, fp16 0.23; a forgotten step 2.1e5 fp32, 25 fp16, 3.3 bf16
(inside bf16's bound: the fp32 check catches it); a cache that never advances 8.4e5 fp32,
13 bf16; a corrupted key 3.6e3 fp32, 0.4-0.7 in half (inside their bounds). Every bug
leaves the sampled tokens nearly all equal (91-100%): token equality alone is weak.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.model.attention import LayerKVCache
from dalle_dist.selftest.sampling import (
    RecordingDecoder,
    fast_path_agreement,
    sampling_half_precision_check,
    sampling_static_cache_check,
)

CPU = torch.device("cpu")
Models = tuple[DALLE, DiscreteVAE, torch.Tensor]
Write = Callable[[LayerKVCache, torch.Tensor, torch.Tensor, torch.Tensor], None]


@pytest.fixture(scope="module")
def tiny() -> Models:
    """(DALL-E, VAE, captions) as sampling_model builds them: 9 text + 4 x 4 image
    positions, default (untrained) weights."""
    torch.manual_seed(0)
    vae = DiscreteVAE(VAEConfig(image_size=16, num_tokens=64, num_layers=2, hidden_dim=16,
                                codebook_dim=16)).eval()
    model = DALLE(DALLEConfig(num_text_tokens=100, text_seq_len=8, num_image_tokens=64,
                              image_fmap_size=4, dim=32, depth=2, heads=2, dim_head=16)).eval()
    text = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    text[:, 4:] = 0
    return model, vae, text


def forgotten_step(write: Write, model: DALLE) -> Write:
    """The first decode step's keys and values never reach the cache."""
    first_image_slot = model.layout.text_len

    def buggy(cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor) -> None:
        if positions.tolist() != [first_image_slot]:
            write(cache, k, v, positions)
    return buggy


def never_advanced(write: Write, model: DALLE) -> Write:
    """Every decode step writes the first image slot: the cache never advances."""
    first_image_slot = model.layout.text_len

    def buggy(cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor) -> None:
        if positions.numel() == 1:
            positions = torch.full_like(positions, first_image_slot)
        write(cache, k, v, positions)
    return buggy


def corrupted_key(write: Write, model: DALLE) -> Write:
    """The first decode step's key is stored with its sign flipped."""
    first_image_slot = model.layout.text_len

    def buggy(cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor) -> None:
        write(cache, -k if positions.tolist() == [first_image_slot] else k, v, positions)
    return buggy


def test_a_correct_cache_passes_the_sampling_checks(tiny: Models) -> None:
    """Both checks the CPU runs, as the selftest runs them: fp32, and fp16 weights over
    the CPU's fp32 cache."""
    status, summary, details = sampling_static_cache_check(CPU, 1, tiny)
    assert status == "PASS", (summary, details)
    assert 0 < details["cached_vs_uncached_rel_err"] <= details["bound"]
    assert details["checked_steps"] == 16 and details["same_tokens"] > 0.9
    status, summary, details = sampling_half_precision_check(CPU, 1, tiny)
    assert status == "PASS", (summary, details)
    assert details["float16"]["cache_dtype"] == "float32"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_correct_half_precision_cache_passes(tiny: Models, dtype: torch.dtype) -> None:
    """The model cast and its cache in the same dtype, as on CUDA (the CPU would keep an
    fp32 cache): the tolerance derived for a half-precision cache holds."""
    model = copy.deepcopy(tiny[0]).to(dtype)
    decoder = RecordingDecoder(model, 2, dtype=dtype)
    agreement = fast_path_agreement(decoder, tiny[2])
    assert decoder.caches[0].k.dtype == dtype
    assert agreement.ok, agreement
    assert agreement.rel_err > 0  # two computations, not one compared with itself


@pytest.mark.parametrize("bug", [forgotten_step, never_advanced, corrupted_key],
                         ids=lambda bug: bug.__name__)
def test_a_cache_bug_fails_the_static_cache_check(tiny: Models, bug: Callable[..., Write],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LayerKVCache, "write", bug(LayerKVCache.write, tiny[0]))
    status, summary, details = sampling_static_cache_check(CPU, 1, tiny)
    assert status == "FAIL", (summary, details)
    assert "off the uncached forward's" in summary


@pytest.mark.parametrize(("bug", "dtype"), [(never_advanced, torch.bfloat16),
                                            (forgotten_step, torch.float16)],
                         ids=["never_advanced-bf16", "forgotten_step-fp16"])
def test_a_cache_bug_fails_the_half_precision_tolerance(
        tiny: Models, bug: Callable[..., Write], dtype: torch.dtype,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a cache of the model's half dtype: the tolerance is not so loose that these
    bugs pass (a forgotten step stays inside bf16's bound here: the fp32 check's to catch)."""
    monkeypatch.setattr(LayerKVCache, "write", bug(LayerKVCache.write, tiny[0]))
    model = copy.deepcopy(tiny[0]).to(dtype)
    agreement = fast_path_agreement(RecordingDecoder(model, 2, dtype=dtype), tiny[2])
    assert not agreement.ok, agreement


def test_the_recorder_copies_the_logits(tiny: Models) -> None:
    """A CUDA graph overwrites its output buffer at its next replay: the recorded logits
    must be a copy even when they are already fp32 (`.float()` would hand back the buffer)."""
    decoder = RecordingDecoder(tiny[0], 2)
    logits = torch.randn(2, 64)
    assert decoder.next_logits(logits) is logits
    logits.zero_()
    assert decoder.seen[0].abs().sum() > 0
