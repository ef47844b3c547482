"""The DALLE-pytorch flags of issue 14 items 4 and 9 through the real CLI: train-vae
--transparent --num_images_save, generate --gentxt, and the one-line errors of bad tokenizer
and sample flags, which stop before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import TINY_VAE_FLAGS, assert_user_error, run_cli


@pytest.fixture(scope="module")
def rgba_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16px RGBA discs on a transparent background, half of them half-transparent."""
    root = tmp_path_factory.mktemp("rgba")
    rng = np.random.default_rng(0)
    for i in range(8):
        yy, xx = np.mgrid[:16, :16]
        cx, cy = rng.uniform(5, 11, 2)
        disc = (xx - cx) ** 2 + (yy - cy) ** 2 < 16
        pixels = np.zeros((16, 16, 4), np.uint8)
        pixels[disc] = (255, 40 * (i % 3), 0, 255 if i % 2 else 128)
        Image.fromarray(pixels, "RGBA").save(root / f"{i}.png")
    return root


def test_train_vae_transparent_with_num_images_save(rgba_folder: Path, tmp_path: Path) -> None:
    """Bugs caught: --num_images_save ignored (grids of 8), --transparent ignored (an RGB
    VAE, RGB grids), or the channel count missing from the checkpoint."""
    out = tmp_path / "vae"
    result = run_cli("train-vae", "--image_folder", str(rgba_folder), "--transparent",
                     *TINY_VAE_FLAGS, "--epochs", "1", "--batch_size", "4",
                     "--num_images_save", "3", "--sample_every_n_steps", "2",
                     "--random_resize_crop_lower_ratio", "1", "--vae_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    payload = torch.load(tmp_path / "vae.pt", weights_only=True)
    assert payload["configs"]["model"]["channels"] == 4
    grids = sorted((tmp_path / "vae-samples").glob("*.png"))
    assert grids
    with Image.open(grids[-1]) as grid:
        assert grid.mode == "RGBA"
        cell = 64 + 2  # 16 px pictures drawn 4x, 2 px gaps
        assert grid.size == (3 * cell + 2, 3 * cell + 2)  # 3 images; originals, soft, hard
        originals = np.asarray(grid)[2:2 + 64, 2:2 + 3 * cell, 3]
    assert {0, 128, 255} <= set(np.unique(originals).tolist()), "the files' alpha, kept"


@pytest.mark.parametrize(("args", "fragment"), [
    (["train-vae", "--num_images_save", "0"], "--num_images_save must be at least 1"),
    (["train", "--hug", "--bpe_path", "missing.json"], "--bpe_path missing.json does not exist"),
], ids=["num_images_save", "hug-missing"])
def test_bad_flags_stop_before_writing(args: list[str], fragment: str, tmp_path: Path) -> None:
    """One process per flag (each costs a start); the other bad tokenizer inputs (a JSON
    without --hug, files youtokentome would accept, contradicting flags) raise the same
    way and are tested in-process in tests/data/test_tokenizer.py. Bug caught:
    a missing check, which lets the run start (and train the built-in VAE first)."""
    (tmp_path / "words.json").write_text('{"model": {"type": "WordLevel"}}')
    out = "--vae_output_file_name" if args[0] == "train-vae" else "--dalle_output_file_name"
    result = run_cli(*args, out, "run/out", cwd=tmp_path)
    assert_user_error(result, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["words.json"]


def test_generate_tokenizer_flag_against_checkpoint_and_gentxt(tiny_dalle: Path,
                                                               tmp_path: Path) -> None:
    """A byte-level checkpoint with --chinese: one line, no outputs. --gentxt from an empty
    prompt: the model writes the caption, printed and saved beside the images."""
    wrong = run_cli("generate", "--dalle_path", str(tiny_dalle), "--text", "a red circle",
                    "--chinese", "--outputs_dir", str(tmp_path / "wrong"), "--device", "cpu")
    assert_user_error(wrong, "--chinese is not the tokenizer", "leave out")
    assert not (tmp_path / "wrong").exists()
    ok = run_cli("generate", "--dalle_path", str(tiny_dalle), "--text", "a small", "--gentxt",
                 "--num_images", "1", "--seed", "0", "--outputs_dir", str(tmp_path / "out"),
                 "--device", "cpu")
    assert ok.returncode == 0, ok.stderr
    [line] = [x for x in ok.stdout.splitlines() if x.startswith("completed caption: ")]
    [caption_file] = (tmp_path / "out").glob("*/caption.txt")
    # bytes, not read_text: the tiny model may write a "\r", which universal newlines
    # would read back as "\n"
    caption = caption_file.read_bytes().decode("utf-8").rstrip("\n")
    assert line == f"completed caption: {caption!r}" and caption.startswith("a small")
    assert (caption_file.parent / "0.png").exists()
