"""Our VQGAN against taming-transformers' own: same tokens, same pixels.

tests/fixtures/vqgan/ holds a tiny VQModel's Lightning checkpoint and YAML written by the
real taming-transformers 0.0.1 from PyPI, with the tokens and pixels taming's model
produced from them (make_fixture.py says how it ran; its --check-ours mode compared
larger configs too: channel changes, no res blocks, attention at several levels).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dalle_dist.checkpoint.taming import load_vqgan
from dalle_dist.model import VQGAN, VQGANConfig, image_tokenizer_from_dict

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vqgan"


@pytest.fixture(scope="module")
def vqgan() -> VQGAN:
    return load_vqgan(FIXTURE / "tiny_vqgan.ckpt", FIXTURE / "tiny_vqgan.yaml")


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURE / "expected.pt", weights_only=True)


def test_tokens_and_pixels_equal_tamings(vqgan: VQGAN, expected: dict) -> None:
    """Fails on any departure from taming's arithmetic: e.g. Downsample padding left/top
    instead of right/bottom, images not mapped [0, 1] -> [-1, 1] on the way in, the
    decoder's output not clamped and mapped back, levels run in the wrong order."""
    tokens = vqgan.get_codebook_indices(expected["images"])
    assert tokens.shape == (3, 64) and tokens.dtype == torch.long
    assert torch.equal(tokens, expected["tokens"])
    pixels = vqgan.decode(expected["tokens"])
    assert pixels.shape == (3, 3, 16, 16)
    torch.testing.assert_close(pixels, expected["pixels"], atol=1e-5, rtol=0)


def test_interface_of_an_image_tokenizer(vqgan: VQGAN) -> None:
    """What DALL-E, generate and the checkpoint read of a tokenizer; fails if fmap_size
    counted every ch_mult level as a halving (4, not 8, here) or the config dict did not
    rebuild the same model (the checkpoint's `tokenizer` key lost)."""
    config = vqgan.config
    assert (config.image_size, config.fmap_size, config.num_tokens) == (16, 8, 32)
    rebuilt = image_tokenizer_from_dict(config.to_dict())
    assert isinstance(rebuilt, VQGAN) and rebuilt.config == config
    rebuilt.load_state_dict(vqgan.state_dict())


def test_codebook_distances_stay_fp32_under_autocast(vqgan: VQGAN) -> None:
    """Latents just past the midpoint of every pair of codebook entries: bf16 distances
    cannot tell the two apart and pick the wrong one for some. Fails if the quantizer
    followed autocast (the encoder itself may run in bf16)."""
    codebook = vqgan.quantize.embedding.weight.double()
    a, b = torch.triu_indices(len(codebook), len(codebook), offset=1)
    latents = (codebook[a] + codebook[b]) / 2 + 1e-3 * (codebook[b] - codebook[a])
    exact = torch.cdist(latents, codebook).argmin(-1)  # float64 reference
    z = latents.float().t().reshape(1, -1, 16, len(a) // 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = vqgan.quantize.indices(z)
    assert torch.equal(under.flatten(), exact)


@pytest.mark.parametrize("change, fragment", [
    ({"ch": 48}, "multiples of 32"),
    ({"resolution": 17}, "not divisible by 2"),
    ({"double_z": True}, "double_z"),
])
def test_configs_taming_would_not_build_are_refused(change: dict, fragment: str) -> None:
    values = {**VQGANConfig(embed_dim=4, n_embed=8, ch=32, ch_mult=(1, 1), num_res_blocks=0,
                            attn_resolutions=(), resolution=16, z_channels=4).to_dict(),
              **change}
    with pytest.raises(Exception, match=fragment):
        VQGAN(VQGANConfig.from_dict(values))
