"""Token sampling: top-k filtering keeps the right logits, and the Gumbel-max draw follows
softmax(logits / temperature) with an explicit, reproducible generator."""

from __future__ import annotations

import pytest
import torch

from dalle_dist.model.sampling import sample_tokens, top_k_filter

DRAWS = 20_000
#: Frequencies of DRAWS independent draws: the standard error of p is at most
#: sqrt(0.25 / 20000) ~= 0.0035, so 0.02 is more than five standard errors.
FREQ_TOL = 0.02


def _frequencies(logits: torch.Tensor, temperature: float, seed: int = 0) -> torch.Tensor:
    """Empirical distribution of DRAWS tokens sampled from one row of logits.

    The row is repeated DRAWS times so one call draws them all, which is what sampling a
    batch does and keeps the test fast.
    """
    generator = torch.Generator().manual_seed(seed)
    batch = logits.expand(DRAWS, -1).contiguous()
    tokens = sample_tokens(batch, filter_thres=0.0, temperature=temperature, generator=generator)
    return torch.bincount(tokens, minlength=logits.shape[-1]).double() / DRAWS


@pytest.mark.parametrize("vocab", [1, 7, 10, 33])
@pytest.mark.parametrize("thres", [0.0, 0.5, 0.9, 0.99, 1.0])
def test_top_k_filter_keeps_exactly_the_largest(vocab: int, thres: float) -> None:
    generator = torch.Generator().manual_seed(vocab)
    # Distinct values (a permutation) so "the largest k" is unambiguous.
    logits = torch.randperm(vocab * 4, generator=generator)[: vocab * 2].view(2, vocab).double()
    filtered = top_k_filter(logits, thres)
    k = max(int((1 - thres) * vocab), 1)
    finite = torch.isfinite(filtered)
    assert finite.sum(dim=-1).tolist() == [k, k]
    assert (filtered[~finite] == float("-inf")).all()
    for row in range(2):
        top = set(logits[row].topk(k).indices.tolist())
        assert set(finite[row].nonzero().flatten().tolist()) == top
        # Kept values are unchanged, not just kept in place.
        assert torch.equal(filtered[row][finite[row]], logits[row][finite[row]])


def test_samples_follow_softmax() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    freq = _frequencies(probs.log(), temperature=1.0)
    assert torch.allclose(freq, probs, atol=FREQ_TOL), (freq, probs)


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64).log()
    expected = torch.softmax(logits / 2.0, dim=-1)
    freq = _frequencies(logits, temperature=2.0, seed=1)
    assert torch.allclose(freq, expected, atol=FREQ_TOL), (freq, expected)
    # At temperature 2 the distribution is visibly flatter than at 1, so the check above
    # would fail if temperature were ignored.
    assert expected[2] < 0.7 - 5 * FREQ_TOL


def test_tiny_temperature_is_argmax() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 17, generator=generator, dtype=torch.float64)
    tokens = sample_tokens(logits, filter_thres=0.0, temperature=1e-8, generator=generator)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_filtered_tokens_are_never_drawn() -> None:
    generator = torch.Generator().manual_seed(3)
    vocab = 20
    logits = torch.randn(1, vocab, generator=generator, dtype=torch.float64).expand(5000, -1)
    thres = 0.5
    allowed = set(logits[0].topk(10).indices.tolist())
    # A high temperature flattens the kept logits, so filtering is the only thing that
    # keeps the other 10 tokens out.
    tokens = sample_tokens(logits, thres, temperature=100.0, generator=generator)
    drawn = set(tokens.tolist())
    assert drawn <= allowed
    assert drawn == allowed  # 5000 near-uniform draws over 10 tokens hit each one


def test_same_seed_same_tokens() -> None:
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(5))

    def draw(seed: int) -> torch.Tensor:
        return sample_tokens(logits, 0.5, 1.0, torch.Generator().manual_seed(seed))

    assert torch.equal(draw(11), draw(11))
    assert not torch.equal(draw(11), draw(12))

