"""Classifier-free guidance (--cond_scale): the doubled-batch cached decoder gives the
logits of two separate uncached forward passes combined as null + (cond - null) x S, and
cond_scale 1 is plain sampling. The training side (--null_cond_prob) nulls captions at
its rate from the global RNG, which every checkpoint records."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from dalle_dist.checkpoint.rng import capture_rng, restore_rng
from dalle_dist.model.decoding import StaticDecoder
from dalle_dist.model.sampling import guide, null_text
from dalle_dist.train.dalle_task import null_captions
from tests.model.test_sampling import (
    PATTERN_SETS,
    _captions,
    _small_model,
    assert_cached_sampling_is_uncached,
    compile_test_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class RecordingDecoder(StaticDecoder):
    """A StaticDecoder that keeps the logits each token is drawn from."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.seen: list[Tensor] = []

    def next_logits(self, logits: Tensor) -> Tensor:
        out = super().next_logits(logits)
        self.seen.append(out.clone())
        return out


def test_guided_logits_equal_two_uncached_passes() -> None:
    """Every position's guided logits against the reference: the captioned and the null
    caption each run alone through the whole sequence (no cache), then combined. All five
    patterns in one model, batch 3 with different paddings, scale 3.

    Bugs seen failing: the sampled token written only to the captioned half (the null half
    then decodes uninitialised tokens), guide() written as cond + (cond - null) x S."""
    model = _small_model(PATTERN_SETS[-1])
    text = _captions(3)
    decoder = RecordingDecoder(model, 3, cond_scale=3.0)
    tokens = decoder.sample(text, 0.0, 1.0, torch.Generator().manual_seed(0))
    assert len(decoder.seen) == model.layout.image_len
    with torch.no_grad():
        for j, got in enumerate(decoder.seen):
            cond = model.uncached_image_logits(text, tokens[:, :j])
            null = model.uncached_image_logits(torch.zeros_like(text), tokens[:, :j])
            want = null + (cond - null) * 3.0
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"position {j}")
    # Guidance changes the logits: the test would pass vacuously if null == cond.
    assert not torch.allclose(decoder.seen[0], cond_first := model.uncached_image_logits(
        text, tokens[:, :0]).detach(), atol=1e-3), cond_first


def test_guided_cached_tokens_equal_uncached() -> None:
    """Token for token, the doubled-batch decoder against the uncached path that runs the
    two passes separately, reused for two batches (the cache is overwritten by each prefill).
    Bug seen failing: the decoder returned all 2b rows (the null half included)."""
    model = _small_model(("full", "conv_like"))
    decoder = StaticDecoder(model, 2, cond_scale=2.5)
    differs = []
    for seed in (0, 1):
        text = _captions(2, seed)
        cached = model.sample_image_tokens(text, 0.5, 1.0, torch.Generator().manual_seed(seed),
                                           decoder=decoder)
        plain = model.sample_image_tokens(text, 0.5, 1.0, torch.Generator().manual_seed(seed),
                                          use_cache=False, cond_scale=2.5)
        assert torch.equal(cached, plain), (seed, cached, plain)
        unguided = model.sample_image_tokens(text, 0.5, 1.0,
                                             torch.Generator().manual_seed(seed))
        differs.append(not torch.equal(cached, unguided))
    assert any(differs)  # guidance did something


@pytest.mark.slow  # torch.compile with Inductor: 20-40 s with a cold cache
def test_compiled_guided_tokens_equal_uncached() -> None:
    """`generate --compile --cond_scale 2.5`'s decoder (StaticDecoder compiled, 2 captions
    doubled to 4 rows) against the uncached guided reference, token for token, reused for
    two batches, with no recompile per token. Its model and step shapes are
    test_compiled_sampling_equals_eager's, so in a session the step compiles once for both.

    Bugs seen failing: the null half fed token 0 instead of the sampled token (other
    tokens from position 7 of seed 0); the null half not fed at all (torch.empty's
    garbage: the compiled kernel's index check fails)."""
    from torch._dynamo.utils import counters

    # Cleared, dynamo must compile this decoder's step itself, exactly once: "<= 1" also
    # passed when the step was never compiled (compiled=True ignored).
    torch._dynamo.reset()
    model = compile_test_model()
    decoder = StaticDecoder(model, 2, compiled=True, cond_scale=2.5)
    graphs_before = counters["stats"]["unique_graphs"]
    assert_cached_sampling_is_uncached(model, decoder, _captions)
    assert counters["stats"]["unique_graphs"] - graphs_before == 1
    text = _captions(2, 1)
    unguided = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(1))
    assert not torch.equal(decoder.sample(text, 0.0, 1.0, torch.Generator().manual_seed(1)),
                           unguided)  # guidance did something


def test_cond_scale_1_is_plain_sampling() -> None:
    """cond_scale 1 draws exactly the tokens of sampling without guidance, cached and
    uncached. Bug seen failing: guide() written as cond + (cond - null) x S (then scale 1
    is not the conditional model)."""
    model = _small_model(("full",))
    text = _captions(3)
    plain = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(4))
    for use_cache in (True, False):
        got = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(4),
                                        use_cache=use_cache, cond_scale=1.0)
        assert torch.equal(got, plain), use_cache
    # The doubled batch at scale 1 still gives the conditional logits (up to rounding).
    cond, null = torch.randn(2, 3, 16).unbind(0)
    torch.testing.assert_close(guide(cond, null, 1.0), cond)
    assert torch.equal(null_text(text), torch.zeros_like(text))


def test_null_captions_rate_and_resume() -> None:
    """--null_cond_prob nulls whole captions (every token to padding id 0) at its rate,
    drawn from the global RNG: restoring a checkpoint's RNG state draws the same masks.
    Bug seen failing: masks drawn from a private generator seeded anew (a resumed run
    nulls other captions)."""
    text = torch.randint(1, 50, (4000, 8))
    torch.manual_seed(3)
    state = capture_rng()
    first = null_captions(text, 0.25)
    nulled = (first == 0).all(dim=1)
    assert ((first == 0) == nulled.unsqueeze(1)).all()  # whole captions, never parts
    assert ((first == text) | nulled.unsqueeze(1)).all()
    assert abs(nulled.float().mean().item() - 0.25) < 0.03
    restore_rng(state)
    assert torch.equal(null_captions(text, 0.25), first)
