"""`train --taming` on built-in data with the tiny taming fixture, then `generate` from the
DALL-E checkpoint alone; and the one-line errors of the three VQGAN flags."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dalle_dist.checkpoint.taming import read_taming_state_dict
from tests.conftest import assert_user_error, run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vqgan"
TINY = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16",
        "--text_seq_len", "40", "--epochs", "1", "--batch_size", "16", "--shapes_count", "32",
        "--fidelity_images", "0"]


@pytest.fixture(scope="module")
def vqgan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """`train --taming` on the built-in shapes: (folder, VQGAN checkpoint, its YAML, the
    run's stdout). The VQGAN files are copies (a test moves them away for a while)."""
    tmp_path = tmp_path_factory.mktemp("vqgan-run")
    ckpt, yaml = tmp_path / "vqgan" / "last.ckpt", tmp_path / "vqgan" / "model.yaml"
    ckpt.parent.mkdir()
    shutil.copy(FIXTURE / "tiny_vqgan.ckpt", ckpt)
    shutil.copy(FIXTURE / "tiny_vqgan.yaml", yaml)
    result = run_cli("train", "--taming", "--vqgan_model_path", str(ckpt),
                     "--vqgan_config_path", str(yaml), *TINY, "--log_every_n_steps", "1",
                     "--dalle_output_file_name", str(tmp_path / "run" / "dalle"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path, ckpt, yaml, result.stdout


def test_vqgan_token_shards_train_as_its_images(vqgan_run: tuple[Path, Path, Path, str],
                                                tmp_path: Path) -> None:
    """`encode` with the VQGAN, then `train --token_shards` with it: the same losses and
    weights as training on the images, bit for bit. Caught: the VQGAN's tokens encoded
    from another view or in another order, or its hash taken from the wrong module."""
    folder, ckpt, yaml = vqgan_run[:3]
    taming = ["--taming", "--vqgan_model_path", str(ckpt), "--vqgan_config_path", str(yaml)]
    encoded = run_cli("encode", *taming, "--shapes_count", "32", "--output",
                      str(tmp_path / "tokens"))
    assert encoded.returncode == 0, encoded.stderr
    assert "32 samples in 1 shard(s) of 8x8 tokens of 32" in encoded.stdout
    out = tmp_path / "run" / "dalle"
    trained = run_cli("train", *taming, *TINY, "--log_every_n_steps", "1", "--token_shards",
                      str(tmp_path / "tokens"), "--dalle_output_file_name", str(out))
    assert trained.returncode == 0, trained.stderr
    got, expected = (torch.load(p, weights_only=True) for p in (
        out.with_suffix(".pt"), folder / "run" / "dalle.pt"))
    assert got["weights"].keys() == expected["weights"].keys()
    assert all(torch.equal(got["weights"][k], t) for k, t in expected["weights"].items())
    losses = [[json.loads(line)["loss"] for line in p.read_text().splitlines()
               if '"loss"' in line] for p in (out.with_suffix(".metrics.jsonl"),
                                              folder / "run" / "dalle.metrics.jsonl")]
    assert losses[0] == losses[1] and len(losses[0]) == 2


def test_train_on_vqgan_tokens_then_generate_from_the_checkpoint_alone(
        vqgan_run: tuple[Path, Path, Path, str], tmp_path: Path) -> None:
    """Fails if the DALL-E checkpoint did not carry the VQGAN's weights (generate after the
    VQGAN file is gone), if the image tokens were not the VQGAN's (its 8x8 map of 32),
    or if generate let a different VQGAN file pass for the one trained with."""
    folder, ckpt, yaml, stdout = vqgan_run
    out = folder / "run" / "dalle"
    assert "16px -> 8x8 tokens of 32" in stdout
    payload = torch.load(out.with_suffix(".pt"), weights_only=True)
    model, vae = payload["configs"]["model"], payload["configs"]["vae"]
    assert (model["num_image_tokens"], model["image_fmap_size"]) == (32, 8)
    assert vae["tokenizer"] == "vqgan" and len(vae["source_sha256"]) == 64
    carried, original = payload["vae_weights"], read_taming_state_dict(ckpt)
    assert set(carried) == set(original)
    assert all(torch.equal(carried[k], original[k].float()) for k in original)

    other = tmp_path / "other.ckpt"  # same weights, another file: not the one trained with
    torch.save({"state_dict": original}, other)
    result = run_cli("generate", "--dalle_path", str(out.with_suffix(".pt")), "--text", "red",
                     "--vqgan_model_path", str(other), "--vqgan_config_path", str(yaml),
                     "--outputs_dir", str(tmp_path / "refused"), cwd=tmp_path)
    assert_user_error(result, "is not the VQGAN", "--dalle_path")
    assert not (tmp_path / "refused").exists()

    away = tmp_path / "away"  # the DALL-E checkpoint alone must be enough
    ckpt.parent.rename(away)
    try:
        result = run_cli("generate", "--dalle_path", str(out.with_suffix(".pt")), "--text",
                         "a red circle", "--num_images", "2", "--seed", "0",
                         "--outputs_dir", str(tmp_path / "images"), cwd=tmp_path)
    finally:
        away.rename(ckpt.parent)  # for the module's other tests
    assert result.returncode == 0, result.stderr
    images = sorted((tmp_path / "images" / "a_red_circle").glob("*.png"))
    assert [p.name for p in images] == ["0.png", "1.png", "grid.png"]


@pytest.mark.parametrize("flags, fragments", [
    (["--taming"], ["--taming needs --vqgan_model_path and --vqgan_config_path",
                    "does not download"]),
    (["--vqgan_model_path", "CORRUPT", "--vqgan_config_path", str(FIXTURE / "tiny_vqgan.yaml")],
     ["--vqgan_model_path", "is not a readable checkpoint"]),
    (["--vqgan_model_path", str(FIXTURE / "tiny_vqgan.ckpt"), "--vqgan_config_path",
      "missing.yaml"], ["--vqgan_config_path missing.yaml does not exist"]),
], ids=["taming-alone", "corrupt-model", "missing-config"])
def test_bad_vqgan_flags_stop_train_with_one_line(tmp_path: Path, flags: list[str],
                                                  fragments: list[str]) -> None:
    """Fails if a bad VQGAN file were found only after the run began writing."""
    (tmp_path / "CORRUPT").write_bytes((FIXTURE / "tiny_vqgan.ckpt").read_bytes()[:4096])
    before = sorted(tmp_path.rglob("*"))
    result = run_cli("train", *flags, *TINY, "--dalle_output_file_name",
                     str(tmp_path / "run" / "dalle"), cwd=tmp_path)
    assert_user_error(result, *fragments)
    assert sorted(tmp_path.rglob("*")) == before, "nothing written"
