"""DALLE: the loss is DALLE-pytorch's (restricted logits, unique padding, weighted image loss),
the transformer is causal, and KV-cached sampling reproduces uncached sampling exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from dalle_dist.model.attention import resolve_impl
from dalle_dist.model.config import DALLEConfig
from dalle_dist.model.dalle import DALLE

#: float64 model; the test recomputes the same sums in a different order, so agreement is
#: limited only by float64 rounding (~1e-16 relative), far below this.
TOL = 1e-10

TINY = DALLEConfig(num_text_tokens=50, text_seq_len=8, num_image_tokens=16, image_fmap_size=4,
                   dim=32, depth=2, heads=2, dim_head=16)


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(config: DALLEConfig = TINY, seed: int = 0, weight_std: float | None = None,
           attn_impl: str = "auto") -> DALLE:
    """A float64 DALLE with deterministic weights.

    weight_std re-initialises every parameter with that spread: the default init (std 0.02)
    gives almost uniform logits, which would make some checks pass by accident.
    """
    torch.manual_seed(seed)
    model = DALLE(config, attn_impl).double()
    if weight_std is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, weight_std)
    return model


def _batch(batch: int = 3, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Captions with different amounts of padding, and random image tokens."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, TINY.num_text_tokens, (batch, TINY.text_seq_len), generator=g)
    for row in range(batch):
        text[row, 2 + 2 * row :] = 0  # 6, 4, 2 ... padding slots
    image = torch.randint(0, TINY.num_image_tokens, (batch, TINY.image_seq_len), generator=g)
    return text, image


def _hidden_states(model: DALLE, text: Tensor, image: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """The model's losses and the transformer output it computed them from (via a hook)."""
    captured: list[Tensor] = []
    handle = model.transformer.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        out = model(text, image)
    finally:
        handle.remove()
    assert len(captured) == 1
    return out, captured[0]


@pytest.mark.parametrize("weight", [7.0, 0.5])
def test_loss_weights_text_and_image(weight: float) -> None:
    model = _model(dataclasses.replace(TINY, loss_img_weight=weight), weight_std=0.2)
    text, image = _batch()
    out = model(text, image)
    expected = (out["text_loss"] + weight * out["image_loss"]) / (weight + 1)
    torch.testing.assert_close(out["loss"], expected, atol=TOL, rtol=0)
    assert out["loss"].requires_grad and out["loss"].dim() == 0


def test_loss_weight_changes_only_the_mix() -> None:
    """Same weights, two loss_img_weight values: same parts, different totals."""
    text, image = _batch()
    a = _model(dataclasses.replace(TINY, loss_img_weight=7.0), weight_std=0.2)(text, image)
    b = _model(dataclasses.replace(TINY, loss_img_weight=0.5), weight_std=0.2)(text, image)
    torch.testing.assert_close(a["text_loss"], b["text_loss"], atol=TOL, rtol=0)
    torch.testing.assert_close(a["image_loss"], b["image_loss"], atol=TOL, rtol=0)
    assert abs(a["text_loss"] - a["image_loss"]) > 1e-3  # else the mix could not differ
    assert abs(a["loss"] - b["loss"]) > 1e-4


def test_restricted_logits_match_masked_full_projection() -> None:
    """DALLE-pytorch computes all logits and puts -inf on the other vocabulary; the model's
    sliced projection must give the same losses."""
    model = _model(weight_std=0.2)
    text, image = _batch()
    out, h = _hidden_states(model, text, image)

    text_vocab = TINY.num_text_tokens + TINY.text_seq_len
    total_vocab = text_vocab + TINY.num_image_tokens
    logits = model.to_logits(h)  # [b, seq_len, total_vocab]
    assert logits.shape == (3, model.layout.seq_len, total_vocab)

    n_text = TINY.text_seq_len  # positions 0..n_text-1 predict text tokens 1..text_seq_len
    position = torch.arange(logits.shape[1])[:, None]
    vocab = torch.arange(total_vocab)[None, :]
    predicts_image = position >= n_text
    is_image_token = vocab >= text_vocab
    logits = logits.masked_fill(predicts_image != is_image_token, float("-inf"))

    text_in = model._text_input(text)
    labels = torch.cat((text_in[:, 1:], image + text_vocab), dim=1)
    text_loss = F.cross_entropy(logits[:, :n_text].flatten(0, 1), labels[:, :n_text].flatten())
    image_loss = F.cross_entropy(logits[:, n_text:].flatten(0, 1), labels[:, n_text:].flatten())

    torch.testing.assert_close(out["text_loss"], text_loss, atol=TOL, rtol=0)
    torch.testing.assert_close(out["image_loss"], image_loss, atol=TOL, rtol=0)
    # Without the mask the losses would be different: the restriction matters here.
    unmasked = F.cross_entropy(model.to_logits(h)[:, n_text:].flatten(0, 1),
                               labels[:, n_text:].flatten())
    assert abs(unmasked - image_loss) > 1e-3


def test_padding_slots_become_unique_tokens() -> None:
    model = _model()
    n, seq = TINY.num_text_tokens, TINY.text_seq_len
    short = torch.tensor([[5, 6, 0, 0, 0, 0, 0, 0]])
    long = torch.tensor([[5, 6, 7, 0, 0, 0, 0, 0]])
    a, b = model._text_input(short), model._text_input(long)

    assert a.shape == b.shape == (1, seq + 1)
    assert a[0, 0] == 0 and b[0, 0] == 0  # <bos>
    assert a[0].tolist() == [0, 5, 6] + [n + i for i in range(2, seq)]
    assert b[0].tolist() == [0, 5, 6, 7] + [n + i for i in range(3, seq)]
    assert not torch.equal(a, b)
    # Slot i is num_text_tokens + i whatever the padding length, so later slots agree.
    assert torch.equal(a[0, 4:], b[0, 4:])
    # No padding slot collides with a caption token or with <bos>.
    assert (a[0, 3:] >= n).all() and (a[0, 1:] != 0).all()


def test_padding_of_all_zeros_caption() -> None:
    model = _model()
    got = model._text_input(torch.zeros(2, TINY.text_seq_len, dtype=torch.long))
    expected = [0] + [TINY.num_text_tokens + i for i in range(TINY.text_seq_len)]
    assert got.tolist() == [expected, expected]


def test_text_input_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match="model expects 8"):
        _model()._text_input(torch.ones(1, 5, dtype=torch.long))


@pytest.mark.parametrize("j", [0, 5, TINY.image_seq_len - 2])
def test_transformer_is_causal_over_image_tokens(j: int) -> None:
    model = _model(weight_std=0.2).eval()
    text, image = _batch(batch=2)
    changed = image.clone()
    changed[:, j] = (changed[:, j] + 1) % TINY.num_image_tokens

    def hidden(tokens: Tensor) -> Tensor:
        x = torch.cat((model._embed_text(model._text_input(text)),
                       model._embed_image(tokens[:, :-1])), dim=1)
        with torch.no_grad():
            return model.transformer(x, model.layout)

    a, b = hidden(image), hidden(changed)
    pos = model.layout.text_len + j  # where image token j is fed
    assert a.shape[1] == model.layout.seq_len
    torch.testing.assert_close(a[:, :pos], b[:, :pos], atol=TOL, rtol=0)
    assert (a[:, pos:] - b[:, pos:]).abs().amax(dim=-1).min() > 1e-6


def test_last_image_token_does_not_change_loss_inputs() -> None:
    """The last image token is only a target: changing it changes the image loss only
    through the label, never the hidden states."""
    model = _model(weight_std=0.2)
    text, image = _batch()
    changed = image.clone()
    changed[:, -1] = (changed[:, -1] + 1) % TINY.num_image_tokens
    _, h1 = _hidden_states(model, text, image)
    _, h2 = _hidden_states(model, text, changed)
    torch.testing.assert_close(h1, h2, atol=0, rtol=0)


@pytest.mark.parametrize("filter_thres", [0.0, 0.9])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("attn_types", [("full",), ("axial_row",), ("axial_col",),
                                        ("conv_like",), ("sparse",),
                                        ("full", "axial_row", "axial_col", "conv_like")])
def test_cached_sampling_equals_uncached(filter_thres: float, temperature: float,
                                         attn_types: tuple[str, ...]) -> None:
    """For every pattern: the uncached reference re-runs the whole sequence through the
    pattern's training path (auto's on CPU; test_band_paths_sample_as_the_cache does the
    band paths), the cache decodes one masked row at a time."""
    config = dataclasses.replace(TINY, attn_types=attn_types, depth=len(attn_types) + 1,
                                 sparse_random_blocks=1)
    model = _model(config, weight_std=0.3)
    text, _ = _batch(batch=3, seed=4)
    samples = []
    for seed in (0, 1, 2):
        cached = model.sample_image_tokens(text, filter_thres, temperature,
                                           torch.Generator().manual_seed(seed), use_cache=True)
        plain = model.sample_image_tokens(text, filter_thres, temperature,
                                          torch.Generator().manual_seed(seed), use_cache=False)
        assert cached.shape == (3, TINY.image_seq_len)
        assert cached.dtype == torch.long
        assert ((cached >= 0) & (cached < TINY.num_image_tokens)).all()
        assert torch.equal(cached, plain), (seed, cached, plain)
        samples.append(cached)
    if filter_thres == 0.0:
        # Different seeds must give different images, or equality above would be trivial.
        # (0.9 keeps int(0.1 * 16) = 1 token: greedy decoding, the same for every seed.)
        assert not torch.equal(samples[0], samples[1])
    else:
        assert torch.equal(samples[0], samples[1])


@pytest.mark.parametrize("attn_impl", ["matmul", "gather"])
def test_band_paths_sample_as_the_cache(attn_impl: str) -> None:
    """The band patterns' CPU paths (auto takes `matmul` from 12 x 12 cells, beyond TINY's
    grid) as the uncached reference: every length of the sequence, padded to the grid,
    must give the cache's tokens. Bug caught: a band path reading the grid's padding."""
    config = dataclasses.replace(TINY, attn_types=("axial_row", "axial_col", "conv_like"),
                                 depth=3)
    model = _model(config, weight_std=0.3, attn_impl=attn_impl)
    text, _ = _batch(batch=2, seed=4)
    cached = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(0))
    plain = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(0),
                                      use_cache=False)
    assert torch.equal(cached, plain)


def test_band_matmuls_train_as_the_fused_gather_did() -> None:
    """The numerics auto changed on CPU (the band patterns moved from band_gather's SDPA to
    band_scores' matmuls at 12 x 12 and 16 x 16 cells): in fp32, at a grid auto sends
    to `matmul`, the loss and every gradient agree with the gather's within fp32 rounding.
    Bug caught: a band path that differs from the one it replaced (a lost scale, a
    misplaced band), at the model level and in single precision."""
    config = dataclasses.replace(TINY, attn_types=("axial_row", "axial_col", "conv_like"),
                                 depth=3, image_fmap_size=16)
    g = torch.Generator().manual_seed(5)
    text = torch.randint(1, config.num_text_tokens, (2, config.text_seq_len), generator=g)
    image = torch.randint(0, config.num_image_tokens, (2, config.image_seq_len), generator=g)
    runs = {}
    for impl in ("gather", "auto"):
        model = _model(config, weight_std=0.5, attn_impl=impl).float()
        paths = {resolve_impl(impl, block.attn.pattern, torch.device("cpu"), model.layout)
                 for block in model.transformer.blocks}
        assert paths == {"gather" if impl == "gather" else "matmul"}
        loss = model(text, image)["loss"]
        runs[impl] = (loss, torch.autograd.grad(loss, list(model.parameters())))
    torch.testing.assert_close(runs["auto"][0], runs["gather"][0], rtol=1e-6, atol=0)
    for got, expected in zip(runs["auto"][1], runs["gather"][1], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_sampling_keeps_training_flag() -> None:
    model = _model()
    text, _ = _batch()
    model.train()
    model.sample_image_tokens(text, generator=torch.Generator().manual_seed(0))
    assert model.training
    assert all(m.training for m in model.modules())

    model.eval()
    model.sample_image_tokens(text, generator=torch.Generator().manual_seed(0))
    assert not model.training
    assert not any(m.training for m in model.modules())


def test_sampling_in_train_mode_ignores_dropout() -> None:
    """Sampling switches to eval inside, so dropout set for training does not leak in."""
    config = dataclasses.replace(TINY, attn_dropout=0.5, ff_dropout=0.5)
    model = _model(config, weight_std=0.3).train()
    text, _ = _batch()
    a = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(3))
    b = model.sample_image_tokens(text, 0.0, 1.0, torch.Generator().manual_seed(3),
                                  use_cache=False)
    assert torch.equal(a, b)


def test_config_dict_round_trip() -> None:
    config = dataclasses.replace(TINY, attn_types=("full", "full"), loss_img_weight=3.0)
    values = config.to_dict()
    assert values["attn_types"] == ["full", "full"]  # plain types for weights_only loading
    restored = DALLEConfig.from_dict({**values, "unknown_future_key": 1})
    assert restored == config
    assert isinstance(restored.attn_types, tuple)
    assert hash(restored) == hash(config)
