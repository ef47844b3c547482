"""DiscreteVAE: token shapes and ranges, the loss and its options, config validation, and a
short training run that shows the model can actually learn the built-in shapes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.errors import ConfigError
from dalle_dist.model.config import VAEConfig
from dalle_dist.model.vae import DiscreteVAE

#: float32 model; recomputing a loss from the same tensors differs by rounding only.
TOL = 1e-6

TINY = VAEConfig(image_size=16, num_tokens=32, codebook_dim=16, num_layers=2,
                 num_resnet_blocks=1, hidden_dim=16)


pytestmark = pytest.mark.usefixtures("one_thread")


def _vae(config: VAEConfig = TINY, seed: int = 0) -> DiscreteVAE:
    """A VAE with weights fixed by `seed`, so two configs can share weights."""
    torch.manual_seed(seed)
    return DiscreteVAE(config)


def _images(count: int, size: int = 16) -> Tensor:
    """`count` shapes images as one [count, 3, size, size] batch in [0, 1]."""
    data = ShapesDataset(count, image_size=size, seed=0)
    return torch.stack([data[i][0] for i in range(count)])


def _forward_capturing_decoder(vae: DiscreteVAE, images: Tensor,
                               seed: int) -> tuple[dict[str, Tensor], Tensor]:
    """vae(images) with the Gumbel noise fixed by `seed`, plus the decoder's raw output."""
    captured: list[Tensor] = []
    handle = vae.decoder.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        torch.manual_seed(seed)
        out = vae(images)
    finally:
        handle.remove()
    return out, captured[0]


def test_codebook_indices_and_decode_shapes() -> None:
    vae = _vae()
    images = _images(3)
    indices = vae.get_codebook_indices(images)
    assert indices.shape == (3, TINY.fmap_size**2) == (3, 16)
    assert indices.dtype == torch.long
    assert ((indices >= 0) & (indices < TINY.num_tokens)).all()

    decoded = vae.decode(indices)
    assert decoded.shape == (3, 3, 16, 16)
    assert decoded.min() >= 0.0 and decoded.max() <= 1.0


def test_codebook_indices_are_row_major_argmax() -> None:
    vae = _vae()
    images = _images(2)
    logits = vae.encoder(images * 2 - 1)  # [b, num_tokens, fmap, fmap]
    expected = logits.argmax(dim=1)  # [b, fmap, fmap]
    assert torch.equal(vae.get_codebook_indices(images).view(2, 4, 4), expected)


def test_forward_loss_reaches_encoder_and_codebook() -> None:
    vae = _vae()
    torch.manual_seed(1)
    out = vae(_images(4))
    assert out["loss"].dim() == 0 and out["loss"].requires_grad
    assert out["recons"].shape == (4, 3, 16, 16)
    assert 0.0 <= out["recons"].min() and out["recons"].max() <= 1.0
    out["loss"].backward()
    for name in ("encoder.0.weight", "codebook.weight", "decoder.0.weight"):
        grad = dict(vae.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("weight", [0.5, 3.0])
def test_kl_weight_adds_weight_times_kl(weight: float) -> None:
    images = _images(4)
    plain = _vae(TINY)
    weighted = _vae(dataclasses.replace(TINY, kl_loss_weight=weight))
    torch.manual_seed(2)
    a = plain(images)
    torch.manual_seed(2)
    b = weighted(images)
    assert b["kl"] > 0  # an untrained encoder is not exactly uniform
    torch.testing.assert_close(a["recon_loss"], b["recon_loss"], atol=0, rtol=0)
    torch.testing.assert_close(a["loss"], a["recon_loss"], atol=0, rtol=0)
    torch.testing.assert_close(b["loss"] - a["loss"], weight * b["kl"], atol=TOL, rtol=0)


def test_kl_is_kl_to_uniform_prior() -> None:
    """kl = sum over cells of KL(q || uniform), averaged over the batch (batchmean)."""
    vae = _vae()
    images = _images(3)
    torch.manual_seed(0)
    out = vae(images)
    q = vae.encoder(images * 2 - 1).flatten(2).transpose(1, 2).softmax(dim=-1)  # [b, hw, n]
    expected = (q * (q.log() + torch.log(torch.tensor(float(TINY.num_tokens))))).sum() / 3
    torch.testing.assert_close(out["kl"], expected.detach(), atol=TOL, rtol=1e-5)


@pytest.mark.parametrize("smooth", [False, True])
def test_recon_loss_function(smooth: bool) -> None:
    vae = _vae(dataclasses.replace(TINY, smooth_l1_loss=smooth))
    images = _images(4)
    out, decoded = _forward_capturing_decoder(vae, images, seed=3)
    target = images * 2 - 1
    loss_fn = F.smooth_l1_loss if smooth else F.mse_loss
    other_fn = F.mse_loss if smooth else F.smooth_l1_loss
    torch.testing.assert_close(out["recon_loss"], loss_fn(decoded, target).detach(),
                               atol=TOL, rtol=0)
    assert abs(out["recon_loss"] - other_fn(decoded, target)) > 1e-4


def test_validate_rejects_indivisible_image_size() -> None:
    with pytest.raises(ConfigError) as info:
        VAEConfig(image_size=30, num_layers=2).validate()
    message = str(info.value)
    assert "--image_size" in message and "30" in message
    assert "divisible by 4" in message
    assert "28" in message and "32" in message  # the nearest sizes that work
    with pytest.raises(ConfigError, match="--image_size"):
        DiscreteVAE(VAEConfig(image_size=30, num_layers=2))


def test_validate_accepts_divisible_sizes() -> None:
    for size in (16, 32, 64):
        VAEConfig(image_size=size, num_layers=2).validate()
    assert VAEConfig(image_size=64, num_layers=3).fmap_size == 8


def test_training_halves_reconstruction_loss() -> None:
    torch.manual_seed(0)
    config = VAEConfig(image_size=16, num_tokens=32, codebook_dim=16, num_layers=2,
                       num_resnet_blocks=0, hidden_dim=32)
    vae = DiscreteVAE(config)
    images = _images(8)
    optimizer = torch.optim.Adam(vae.parameters(), lr=3e-3)

    def recon_loss() -> float:
        # Gumbel noise makes single evaluations jumpy; average a few fixed draws.
        torch.manual_seed(123)
        with torch.no_grad():
            return sum(float(vae(images)["recon_loss"]) for _ in range(4)) / 4

    before = recon_loss()
    for _ in range(200):
        optimizer.zero_grad()
        vae(images)["loss"].backward()
        optimizer.step()
    after = recon_loss()
    assert after <= 0.5 * before, f"recon loss {before:.4f} -> {after:.4f}, not halved"
