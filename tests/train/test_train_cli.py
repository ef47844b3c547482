"""`train-vae` and `train` through the real CLI on tiny models: what they write and log."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig
from tests.conftest import (
    TINY_DALLE_FLAGS,
    TINY_TRAIN_FLAGS,
    TINY_VAE_FLAGS,
    assert_user_error,
    run_cli,
)

STEPS_PER_EPOCH = 64 // 16  # --shapes_count 64 at --batch_size 16, last partial batch dropped


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_vae_checkpoint_is_safe_and_complete(tiny_vae: Path) -> None:
    payload = torch.load(tiny_vae, weights_only=True)
    assert payload["kind"] == "vae"
    assert payload["format_version"] == 1
    assert payload["step"] == STEPS_PER_EPOCH and payload["epoch"] == 1
    assert payload["backend"] == "single" and payload["world_size"] == 1
    config = VAEConfig.from_dict(payload["configs"]["model"])
    assert (config.image_size, config.num_tokens, config.codebook_dim) == (16, 32, 16)
    vae = DiscreteVAE(config)
    vae.load_state_dict(payload["weights"])
    assert payload["optimizer"]["state"], "Adam moments are saved for resuming"
    assert len(payload["rng"]) == 1, "one RNG record per rank"
    assert set(payload["rng"][0]) >= {"python", "numpy", "torch"}
    assert (payload["batch"], payload["loss_sum"]) == (0, 0.0), "saved at the epoch's end"
    assert not list(tiny_vae.parent.glob("*.tmp")), "no temporary file left behind"


def test_train_vae_logs_metrics_and_samples(tmp_path: Path) -> None:
    result = run_cli("train-vae", *TINY_VAE_FLAGS, *TINY_TRAIN_FLAGS, "--epochs", "2",
                     "--log_every_n_steps", "2", "--sample_every_n_steps", "4",
                     "--vae_output_file_name", str(tmp_path / "run" / "vae"))
    assert result.returncode == 0, result.stderr
    assert "64 images found" in result.stdout or "built-in shapes: 64 images" in result.stdout
    assert (tmp_path / "run" / "vae.pt").exists(), ".pt is appended to the output name"
    records = _metrics(tmp_path / "run" / "vae.metrics.jsonl")
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    for record in records:
        assert {"loss", "lr", "samples_per_s", "temperature", "recon_loss", "kl"} <= set(record)
        assert record["samples_per_s"] > 0
    grids = sorted((tmp_path / "run" / "vae-samples").glob("step-*.png"))
    assert [g.name for g in grids] == ["step-0000004.png", "step-0000008.png"]
    with Image.open(grids[0]) as grid:  # rows: originals, soft and hard reconstructions
        assert grid.size[1] > 3 * 16


def test_dalle_checkpoint_carries_vae_and_tokenizer(tiny_dalle: Path, tiny_vae: Path) -> None:
    payload = torch.load(tiny_dalle, weights_only=True)
    assert payload["kind"] == "dalle"
    assert payload["configs"]["tokenizer"] == {"kind": "byte"}
    model = DALLE(DALLEConfig.from_dict(payload["configs"]["model"]))
    model.load_state_dict(payload["weights"])
    vae_payload = torch.load(tiny_vae, weights_only=True)
    for name, tensor in vae_payload["weights"].items():
        assert torch.equal(payload["vae_weights"][name], tensor), name
    assert payload["configs"]["vae"] == vae_payload["configs"]["model"]


def test_train_prints_fidelity_last_and_learns(tmp_path: Path, tiny_vae: Path) -> None:
    out = tmp_path / "dalle"
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                     "--shapes_count", "256", "--batch_size", "16", "--epochs", "2",
                     "--learning_rate", "3e-3", "--log_every_n_steps", "4",
                     "--fidelity_images", "8", "--dalle_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("caption fidelity: ") and last.endswith(" over 8 images"), last
    assert 0.0 <= float(last.split()[2]) <= 1.0
    records = _metrics(tmp_path / "dalle.metrics.jsonl")
    assert records[-1]["loss"] < 0.7 * records[0]["loss"], "the loss falls while training"
    assert {"text_loss", "image_loss", "grad_norm"} <= set(records[0])
    with Image.open(tmp_path / "dalle-samples" / "fidelity.png") as grid:
        assert grid.size[0] > 16


def test_resume_continues_from_the_checkpoint(tmp_path: Path, tiny_dalle: Path) -> None:
    start = torch.load(tiny_dalle, weights_only=True)
    out = tmp_path / "resumed"
    result = run_cli("train", "--dalle_path", str(tiny_dalle), "--epochs", "2",
                     "--batch_size", "16", "--shapes_count", "64", "--fidelity_images", "0",
                     "--dalle_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    assert f"resuming {tiny_dalle} at step {STEPS_PER_EPOCH} (epoch 1)" in result.stdout
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert resumed["step"] == 2 * STEPS_PER_EPOCH and resumed["epoch"] == 2
    assert resumed["configs"]["model"] == start["configs"]["model"]
    changed = any(not torch.equal(resumed["weights"][k], v) for k, v in start["weights"].items())
    assert changed, "the resumed epoch trained the weights further"


def test_train_on_an_image_text_folder(tmp_path: Path, tiny_vae: Path) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    for i, colour in enumerate(["red", "green", "blue", "yellow"] * 4):
        Image.new("RGB", (24, 20), colour).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a {colour} picture\nplain {colour}\n")
    (folder / "broken.png").write_bytes(b"not a png")
    (folder / "broken.txt").write_text("never used\n")
    result = run_cli("train", "--image_text_folder", str(folder), "--vae_path", str(tiny_vae),
                     *TINY_DALLE_FLAGS, "--epochs", "1", "--batch_size", "4",
                     "--dalle_output_file_name", str(tmp_path / "dalle"))
    assert result.returncode == 0, result.stderr
    assert "16 image-text pairs found, skipped 1 unreadable images" in result.stdout
    assert "caption fidelity" not in result.stdout, "fidelity is only for built-in shapes"
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == 4


def test_folder_without_vae_path_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "pairs"
    folder.mkdir()
    Image.new("RGB", (16, 16), "red").save(folder / "a.png")
    (folder / "a.txt").write_text("red\n")
    before = sorted(tmp_path.rglob("*"))
    result = run_cli("train", "--image_text_folder", str(folder),
                     "--dalle_output_file_name", str(tmp_path / "dalle"), cwd=tmp_path,
                     env={"DALLE_DIST_CACHE": str(tmp_path / "cache")})
    # DALLE-pytorch users expect OpenAI's pretrained dVAE here: the line names it and the
    # two ways that work (fails if the message loses either alternative).
    assert_user_error(result, "--vae_path is required", "OpenAI's pretrained dVAE",
                      "train-vae", "--taming --vqgan_model_path")
    # Fails if the refusal comes after a VAE was trained (into the cache) or a save began.
    assert sorted(tmp_path.rglob("*")) == before, "nothing written"


def test_sample_grids_do_not_change_training(tmp_path: Path, tiny_vae: Path) -> None:
    """Same seed, grids every step or never: bit-identical weights (sampling uses its own RNG)."""
    weights = []
    for every in ("1", "0"):
        out = tmp_path / f"every{every}"
        result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                         *TINY_TRAIN_FLAGS, "--fidelity_images", "0", "--attn_dropout", "0.1",
                         "--sample_every_n_steps", every, "--dalle_output_file_name", str(out))
        assert result.returncode == 0, result.stderr
        weights.append(torch.load(tmp_path / f"every{every}.pt", weights_only=True)["weights"])
    assert len(list((tmp_path / "every1-samples").glob("step-*.png"))) == STEPS_PER_EPOCH
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name
