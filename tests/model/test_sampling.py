"""Token sampling: top-k filtering keeps the right logits, and the Gumbel-max draw follows
softmax(logits / temperature) with an explicit, reproducible generator. Decoding through the
static KV cache gives the uncached reference's tokens for every pattern, with fixed shapes,
no host sync, and the same tokens when its step is compiled."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.decoding import StaticDecoder, compile_mode
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



# -- the static KV cache (model/decoding.py) --------------------------------------------

#: Each pattern alone, and all five cycled over the layers of one model.
PATTERN_SETS = [("full",), ("axial_row",), ("axial_col",), ("conv_like",), ("sparse",),
                ("full", "axial_row", "axial_col", "conv_like", "sparse")]
SMALL = DALLEConfig(num_text_tokens=50, text_seq_len=8, num_image_tokens=16, image_fmap_size=4,
                    dim=32, depth=2, heads=2, dim_head=16, sparse_random_blocks=1)


pytestmark = pytest.mark.usefixtures("one_thread")


def _small_model(attn_types: tuple[str, ...], **options: bool) -> DALLE:
    """float32, as users sample; weights spread wide enough that logits are far from uniform
    (the default init would make every sampler look right). options: DALLEConfig switches
    (--rotary_emb, --shift_tokens)."""
    torch.manual_seed(0)
    model = DALLE(dataclasses.replace(SMALL, attn_types=attn_types,
                                      depth=max(2, len(attn_types)), **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def _captions(batch: int, seed: int = 0) -> torch.Tensor:
    """Rows with different amounts of padding, so rows cannot be mixed up unnoticed."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, SMALL.num_text_tokens, (batch, SMALL.text_seq_len), generator=g)
    for row in range(batch):
        text[row, 2 + 2 * row:] = 0
    return text


@pytest.mark.parametrize("attn_types", PATTERN_SETS, ids="+".join)
def test_static_cache_equals_uncached_for_every_pattern(attn_types: tuple[str, ...]) -> None:
    """One decoder, reused for two batches of captions (batch 3), against the uncached
    reference that re-runs the whole sequence through the training path.

    Bugs: a wrong row of the pattern's mask for the decoded position (seen failing for
    every pattern with the previous position's row), an unwritten cache slot left visible,
    keys written at the wrong position.
    """
    model = _small_model(attn_types)
    assert_cached_sampling_is_uncached(model, StaticDecoder(model, 3), _captions)


def assert_cached_sampling_is_uncached(model: DALLE, decoder: StaticDecoder,
                                       captions: Callable[[int, int], torch.Tensor]) -> None:
    """Two seeds of sampling through the decoder (reused, its batch of rows) equal
    sampling without a cache, token for token, at the decoder's cond_scale (a guided
    decoder against the two uncached passes); the rows differ (different captions and
    noise), so a row mix-up cannot hide."""
    for seed in (0, 1):
        text = captions(decoder.batch, seed)
        cached = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(seed),
                                           decoder=decoder)
        plain = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(seed),
                                          use_cache=False, cond_scale=decoder.cond_scale)
        assert torch.equal(cached, plain), (seed, cached, plain)
        assert not torch.equal(cached[0], cached[1])


def test_cache_keeps_its_shapes_across_steps() -> None:
    """Every decode step attends over the same [b, heads, max_len, dim_head] keys: the
    shapes a compiled step or a CUDA graph needs. Bug: the cache returned its filled prefix
    (k[:, :, :length]), a new shape every token."""
    model = _small_model(("full", "axial_row"))
    shapes: list[tuple[tuple[int, ...], ...]] = []

    class RecordSdpa(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is F.scaled_dot_product_attention:
                shapes.append(tuple(tuple(a.shape) for a in args[:3]))
            return func(*args, **(kwargs or {}))

    with RecordSdpa():
        model.sample_image_tokens(_captions(2), 0.0, 1.0, torch.Generator().manual_seed(0))
    layers = 2
    prefill, steps = shapes[:layers], shapes[layers:]
    assert len(steps) == layers * (SMALL.image_seq_len - 1)
    max_len = model.layout.seq_len
    assert set(steps) == {((2, 2, 1, 16), (2, 2, max_len, 16), (2, 2, max_len, 16))}
    assert prefill[0][1] == (2, 2, max_len, 16)


#: Tensor methods that make the host wait for the device.
SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
         torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}


def test_decoding_never_reads_the_device_on_the_host() -> None:
    """Sampling 16 tokens costs no host sync: on CUDA each one stalls the launch queue.
    Bug: a position kept as a Python int read back with .item(), or a loop that stops on
    `if (tokens == eos).any()`."""
    model = _small_model(("full", "conv_like"))
    decoder = StaticDecoder(model, 2)
    text = _captions(2)
    seen: list[str] = []

    class RecordSyncs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in SYNCS:
                seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with RecordSyncs():
        decoder.sample(text, 0.5, 1.0, torch.Generator().manual_seed(0))
    assert seen == []


def compile_test_model() -> DALLE:
    """The model the compiled decoders are tested on: all five patterns, --rotary_emb and
    --shift_tokens on (their decode-step state compiles too). Compiling it takes tens of
    seconds on CPU, once per session: a decoder of the same shapes compiles from
    Inductor's cache (test_guidance's compiled guided decoder: batch 2, doubled to 4)."""
    torch.manual_seed(0)
    model = DALLE(dataclasses.replace(SMALL, attn_types=PATTERN_SETS[-1], depth=5,
                                      rotary_emb=True, shift_tokens=True)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.mark.slow  # torch.compile with Inductor: 20-40 s with a cold cache
def test_compiled_sampling_equals_eager() -> None:
    """The torch.compile test (compile_test_model), batch 4, two calls. Same tokens as
    the eager decoder, and one graph for every position. Bugs: the position baked in as a
    constant (a recompile per token, then dynamo's limit and a silent fall back to
    eager), a graph break that fullgraph refuses, a compiled step that reads a stale
    cache; a rotation table or a shift slot indexed by a Python int."""
    from torch._dynamo.utils import counters

    # Dynamo keeps the graphs it compiled for StaticDecoder.step (test_guidance's decoder
    # has these shapes) and would reuse one here: cleared, this decoder must compile its
    # own, exactly once (Inductor's cache still makes that quick).
    torch._dynamo.reset()
    model = compile_test_model()
    eager, compiled = StaticDecoder(model, 4), StaticDecoder(model, 4, compiled=True)
    graphs_before = counters["stats"]["unique_graphs"]
    for seed in (0, 1):
        text = _captions(4, seed)
        want = eager.sample(text, 0.0, 1.0, torch.Generator().manual_seed(seed))
        got = compiled.sample(text, 0.0, 1.0, torch.Generator().manual_seed(seed))
        assert torch.equal(got, want), (seed, got, want)
    assert counters["stats"]["unique_graphs"] - graphs_before == 1


def test_compile_mode_is_cuda_graphs_only_on_cuda() -> None:
    assert compile_mode(torch.device("cuda", 0)) == "reduce-overhead"
    assert compile_mode(torch.device("cpu")) == "default"
