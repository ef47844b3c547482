"""`dalle-dist plan --taming --vqgan_config_path model.yaml`: the VQGAN sized from its YAML
alone, its frozen weights and its encode counted where the VAE's are, and its bad input
refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from dalle_dist import plan
from dalle_dist.checkpoint.taming import read_vqgan_config
from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.model.vqgan import VQGAN
from dalle_dist.plan.vqgan import encode_bytes, vqgan_encode_bytes, with_vqgan
from tests.conftest import assert_user_error
from tests.test_plan import plan_main

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vqgan"
YAML = FIXTURE / "tiny_vqgan.yaml"  # 16 px -> 8 x 8 tokens of 32
ARGS = ["--json", "--precision", "fp32,bf16", "--gpus", "2", "--batch_size", "8",
        "--device", "cpu", "--depth", "2"]


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert plan_main([*ARGS, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_counts_the_vqgan_and_its_encode(capsys: pytest.CaptureFixture[str]) -> None:
    """Against the plan of the same DALL-E on a VAE with the same image and tokens (16 px,
    one halving, 32 tokens): the rows differ by exactly the VQGAN's fp32 weights minus the
    VAE's, resident on every GPU, and by its encode in place of the VAE's; everything the
    DALL-E trains is unchanged. Bug seen failing: plan sized the stand-in DiscreteVAE it
    gives plan.estimate (with_vqgan not applied: 233,251 parameters and 70 KiB per encoded
    image where the VQGAN has 230,575 and 166 KiB)."""
    vq = plan_json(capsys, "--taming", "--vqgan_config_path", str(YAML))
    vae = plan_json(capsys, "--image_size", "16", "--num_layers", "1", "--num_tokens", "32")
    config = read_vqgan_config(YAML)
    weights = sum(p.numel() for p in VQGAN(config).parameters())  # built for real, on CPU
    assert vq["parameters"]["vae"] == weights
    assert vq["model"]["vae"]["tokenizer"] == "vqgan" and vq["model"]["vae"]["n_embed"] == 32
    assert vq["parameters"]["dalle"] == vae["parameters"]["dalle"]
    assert vq["sequence"] == vae["sequence"] and vq["sequence"]["image"] == 64
    delta = 4 * (weights - vae["parameters"]["vae"])
    assert delta != 0
    per_image = vqgan_encode_bytes(config, "cpu")
    for got, base in zip(vq["rows"], vae["rows"], strict=True):
        for key in ("backend", "zero_stage", "precision", "micro_batch", "params", "grads",
                    "optimizer", "activations"):
            assert got[key] == base[key], key
        assert got["items"]["vae_params"] == 4 * weights
        assert got["buffers"] - base["buffers"] == delta
        assert got["items"]["vae_activations"] == per_image * got["micro_batch"]
        # (the DALL-E's step, not the tiny encode, is this row's widest phase)
        assert got["peak"] - base["peak"] == delta, got["backend"]
    assert plan_main(["--taming", "--vqgan_config_path", str(YAML), "--depth", "2"]) == 0
    assert "VQGAN 0.23M (frozen)" in capsys.readouterr().out


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_encode_bytes_reproduce_the_vaes_measured_model(device: str) -> None:
    """The meta-device count (every allocation alive until its last reference, plus
    oneDNN's reorder per conv on CPU) equals plan's hand model of a DiscreteVAE's encode,
    which tests/accuracy/plan_check.py checks against real CPU peaks, for three VAE shapes.
    Bugs seen failing: tensors never freed (the sum of all allocations, 2.1 x the widest
    moment); the CPU reorder copy left out (the cpu case, 10% low)."""
    for v in (VAEConfig(), VAEConfig(image_size=64, num_layers=2, num_resnet_blocks=1),
              VAEConfig(image_size=32, num_layers=3, hidden_dim=32, num_tokens=512)):
        with torch.device("meta"):
            model = DiscreteVAE(v)
        assert encode_bytes(model, v.channels, v.image_size, device) == \
            plan.vae_activation_bytes(v, device), v


def test_a_large_vqgans_encode_sets_the_peak(tmp_path: Path) -> None:
    """taming's f16 ImageNet VQGAN (vqgan_imagenet_f16_16384's ddconfig, no weights) under
    a small DALL-E: its encode is every row's widest phase, so the peak is the resident
    state plus batch x the encode; its weights are ~300 MB on every GPU."""
    yaml = tmp_path / "model.yaml"
    yaml.write_text(json.dumps({"model": {"target": "taming.models.vqgan.VQModel", "params": {
        "embed_dim": 256, "n_embed": 16384, "ddconfig": {
            "double_z": False, "z_channels": 256, "resolution": 256, "in_channels": 3,
            "out_ch": 3, "ch": 128, "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 2,
            "attn_resolutions": [16], "dropout": 0.0}}}}))  # JSON is YAML
    config = read_vqgan_config(yaml)
    with torch.device("meta"):
        weights = sum(p.numel() for p in VQGAN(config).parameters())
    assert 70e6 < weights < 80e6  # the encoder, decoder and codebook (no discriminator)
    dalle = DALLEConfig(num_text_tokens=257, text_seq_len=16, num_image_tokens=16384,
                        image_fmap_size=16, dim=64, depth=1, heads=2, dim_head=32)
    from dalle_dist.plan.vqgan import stand_in_vae

    stand_in = stand_in_vae(config)
    rows = with_vqgan(plan.estimate(dalle, 4, 2, vae=stand_in, precisions=("bf16",)),
                      config, stand_in, "cuda")
    per_image = vqgan_encode_bytes(config, "cuda")
    # at least the first level's two full-resolution 128-channel maps, fp32
    assert per_image > 2 * 128 * 256 * 256 * 4
    for row in rows:
        assert row.items["vae_params"] == 4 * weights
        assert row.peak == row.static + per_image * row.micro_batch, row.backend


@pytest.mark.parametrize(("args", "fragment"), [
    (["--taming"], "--taming needs --vqgan_config_path"),
    (["--vqgan_model_path", str(FIXTURE / "tiny_vqgan.ckpt")], "needs --vqgan_config_path"),
    (["--vqgan_config_path", "missing.yaml"], "missing.yaml does not exist"),
    (["--vqgan_config_path", str(YAML), "--vqgan_model_path", "gone.ckpt"],
     "gone.ckpt is not a file"),
    (["--vqgan_config_path", "NO_DDCONFIG"], "has no model.params.ddconfig"),
    (["--vqgan_config_path", str(YAML), "--image_size", "64"],
     "--image_size and --vqgan_config_path both shape"),
])
def test_plan_vqgan_errors_are_one_line(args: list[str], fragment: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    no_ddconfig = tmp_path / "no_ddconfig.yaml"
    no_ddconfig.write_text("model:\n  params:\n    embed_dim: 4\n    n_embed: 32\n")
    args = [str(no_ddconfig) if a == "NO_DDCONFIG" else a for a in args]
    status = plan_main(args)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_user_error(subprocess.CompletedProcess(args, status, captured.out, captured.err),
                      fragment)
