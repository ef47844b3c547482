"""Encode once, train from tokens (docs/training.md, "Encode once"): `dalle-dist encode` on
one process and on 2 torchrun ranks writes the same shards, a killed encode finishes to
them, and `train --token_shards` equals training from the images, bit for bit, on one
process and on 2 ranks (the `trained` fixture's fp32 runs are the image side).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from PIL import Image

from dalle_dist.data import ShapesDataset, TextImageFolder
from dalle_dist.data.token_shards import MANIFEST, TokenShards
from dalle_dist.data.tokenizer import ByteTokenizer, tokenize
from dalle_dist.data.wds import split_key
from dalle_dist.train.cpu_settings import HEAP_KEPT_ENCODE
from tests import launch
from tests.backends.runs import BATCH, ROOT, STEPS, Run, metric_records
from tests.conftest import assert_user_error, run_cli
from tests.data.test_wds import write_shards

#: the `trained` runs' data: the first STEPS x BATCH built-in shapes, in 3 shards (30, 30, 20)
ENCODE = ["--shapes_count", str(STEPS * BATCH), "--shard_size", "30", "--batch_size", "16"]


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def shards(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shards") / "tokens"
    result = run_cli("encode", "--vae_path", str(tiny_vae), *ENCODE, "--output", str(folder))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{folder / MANIFEST}: 80 samples in 3 shard(s) of 4x4 tokens of 32" in result.stdout
    # on CPU the batches reuse each other's memory (train/cpu_settings.py), said once
    assert result.stdout.count(HEAP_KEPT_ENCODE) == 1, result.stdout[-3000:]
    return folder


@pytest.mark.parametrize("name", ["single", "torch"])
def test_training_from_shards_equals_training_from_images(
        name: str, shards: Path, trained: Callable[..., Run]) -> None:
    """Shard row i is image i, read as the image run reads it (no random crop on the
    16px shapes), and the same sampler draws the same rows: every step's loss and
    gradient norm and the final weights are equal, not close. The shards' held-out split
    is the images' (the same keys). Caught: shards written out of the source's order,
    another crop than the training read, or tokens encoded off by one codebook entry."""
    images, tokens = trained(name, "fp32"), trained(name, "fp32", "--token_shards",
                                                    str(shards))
    assert f"token shards {shards}: 80 samples in 3 shard(s)" in tokens.text
    assert [r["loss"] for r in tokens.metrics] == [r["loss"] for r in images.metrics]
    assert tokens.grad_norms == images.grad_norms
    assert tokens.payload["weights"].keys() == images.payload["weights"].keys()
    for key, tensor in images.payload["weights"].items():
        assert torch.equal(tokens.payload["weights"][key], tensor), key
    data = tokens.payload["configs"]["data"]
    assert data["token_shards"] == str(shards) and len(data["token_shards_manifest_sha256"]) == 64
    assert len(list((tokens.folder / "dalle-samples").glob("step-*.png"))) == 2
    assert TokenShards(shards).keys() == ShapesDataset(STEPS * BATCH, 16).keys()


def test_captions_are_stored_as_text_and_as_token_ids(shards: Path) -> None:
    """Each row keeps its caption's text (training tokenizes it with its own flags) and
    the ids the encode's tokenizer gave it at --text_seq_len (48 by default), as the
    manifest names them. Caught: ids of another row, or of the unpadded caption."""
    data = TokenShards(shards)
    text = data.manifest["text_tokenizer"]
    assert (text["kind"], text["vocab_size"], text["text_seq_len"]) == ("byte", 257, 48)
    for i in (0, 31, 79):
        ids, caption = data.text_ids(i), data[i][1]
        assert torch.equal(ids, tokenize(ByteTokenizer(), [caption], 48)), i


LAUNCHERS = {"torchrun": (launch.torchrun, ["--distributed_backend", "torch"]),
             "deepspeed": (launch.deepspeed, ["--deepspeed"]),
             "horovodrun": (launch.horovodrun, ["--distributed_backend", "horovod"])}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_ranks_encode_the_same_shards(launcher: str, shards: Path, tiny_vae: Path,
                                          tmp_path: Path) -> None:
    """Under each launcher `train` supports, rank r encodes shards r, r + 2, ...; rank 0
    writes the manifest after the barrier: every file equals the one-process encode's,
    byte for byte."""
    out = tmp_path / "tokens"
    run, flags = LAUNCHERS[launcher]
    result = run("encode", *flags, "--vae_path", str(tiny_vae), *ENCODE, "--output",
                 str(out), cwd=tmp_path)
    assert result.returncode == 0, launch.output(result)[-3000:]
    assert files(out) == files(shards)


def test_a_killed_encode_finishes_to_the_same_shards(shards: Path, tiny_vae: Path,
                                                     tmp_path: Path) -> None:
    """SIGKILL half-way through writing the second shard: no manifest, the first shard
    complete, the second only a temporary file. The same command again keeps the first,
    removes the half file, writes the rest: the same bytes as an uninterrupted encode.
    Caught: a shard written in place (a half shard the rerun keeps), or the manifest
    written before every shard is complete."""
    out = tmp_path / "tokens"
    args = ["encode", "--vae_path", str(tiny_vae), *ENCODE, "--output", str(out)]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "KILL_AT_SHARD": "2"}
    killed = launch._run([launch.sys.executable, "-m", "tests.backends.encode_kill_probe",
                          *args], tmp_path, env, launch.LAUNCH_TIMEOUT)
    assert killed.returncode != 0 and "kill probe: killed while writing shard 2" in (
        launch.output(killed))
    left = sorted(p.name for p in out.iterdir())
    assert MANIFEST not in left and "shard-000000.safetensors" in left
    assert "shard-000001.safetensors" not in left and any(n.endswith(".tmp") for n in left)
    assert_user_error(run_cli("train", "--token_shards", str(out), "--vae_path",
                              str(tiny_vae)), "has no manifest.json", "finish")

    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of this rank's 3 shard(s) are complete from an earlier encode: kept" in (
        again.stdout + again.stderr)
    assert files(out) == files(shards)


def test_shards_of_another_image_tokenizer_are_refused(shards: Path, tiny_vae: Path,
                                                       tmp_path: Path) -> None:
    """One weight of the VAE changed: its codebook ids mean something else, so training
    stops before anything is written, naming both hashes."""
    payload = torch.load(tiny_vae, weights_only=True)
    name = next(iter(payload["weights"]))
    payload["weights"][name] = payload["weights"][name] + 1e-3
    other = tmp_path / "other-vae.pt"
    torch.save(payload, other)
    result = run_cli("train", "--token_shards", str(shards), "--vae_path", str(other),
                     "--dalle_output_file_name", str(tmp_path / "run"))
    assert_user_error(result, f"--token_shards {shards} was encoded by the DiscreteVAE",
                      "pass the VAE (--vae_path) or VQGAN it was encoded with")
    assert not list(tmp_path.glob("run*"))
    both = run_cli("train", "--token_shards", str(shards), "--image_text_folder",
                   str(tmp_path), "--vae_path", str(tiny_vae))
    assert_user_error(both, "--token_shards replaces --image_text_folder and --wds")


def test_a_resume_mid_epoch_on_shards_ends_where_the_whole_run_ends(
        shards: Path, tiny_vae: Path, tmp_path: Path) -> None:
    """Two epochs from shards with a save kept every 3 steps; the save of step 3 (mid
    epoch 0) continued into another output ends with the same weights and the same losses
    from step 4 on: the position is sought by index (the sampler skips the first 48
    samples' indices), nothing replayed or skipped twice. The resumed run checks the
    shards against the VAE its checkpoint carries."""
    common = ["--token_shards", str(shards),
              "--dim", "32", "--depth", "2", "--heads", "2", "--dim_head", "16",
              "--text_seq_len", "40", "--batch_size", "16", "--epochs", "2",
              "--fidelity_images", "0", "--log_every_n_steps", "1", "--learning_rate", "3e-3"]
    whole = run_cli("train", *common, "--vae_path", str(tiny_vae), "--save_every_n_steps",
                    "3", "--keep_n_checkpoints", "9",
                    "--dalle_output_file_name", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed = run_cli("train", *common, "--resume", str(tmp_path / "whole-checkpoints" /
                                                         "step-0000003.pt"),
                      "--dalle_output_file_name", str(tmp_path / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 3 (epoch 0, 3 batches into the next)" in resumed.stdout
    losses = [{r["step"]: r["loss"] for r in metric_records(tmp_path / f"{n}.metrics.jsonl")}
              for n in ("whole", "resumed")]
    assert sorted(losses[1]) == list(range(4, 11))
    assert all(losses[1][s] == losses[0][s] for s in losses[1])
    end = [torch.load(tmp_path / f"{n}.pt", weights_only=True)["weights"]
           for n in ("whole", "resumed")]
    assert all(torch.equal(end[1][k], t) for k, t in end[0].items())


def test_an_image_folder_encodes_and_trains_as_its_images(tiny_vae: Path,
                                                          tmp_path: Path) -> None:
    """A folder of square 16px PNGs with captions: encode, then train from the shards,
    equals training from the folder read without random crops
    (--random_resize_crop_lower_ratio 1 on square images is the centred square). The
    keys are the files' paths, as the image split's."""
    folder = tmp_path / "pairs"
    (folder / "sub").mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for i in range(32):
        pixels = torch.randint(256, (16, 16, 3), generator=generator, dtype=torch.uint8)
        stem = folder / ("sub" if i % 3 == 0 else "") / f"img{i:02d}"
        Image.fromarray(pixels.numpy()).save(stem.with_suffix(".png"))
        stem.with_suffix(".txt").write_text(f"picture {i} of a {['red', 'blue'][i % 2]} thing")
    encoded = run_cli("encode", "--image_text_folder", str(folder), "--vae_path",
                      str(tiny_vae), "--output", str(tmp_path / "tokens"))
    assert encoded.returncode == 0, encoded.stderr[-3000:]
    common = ["--vae_path", str(tiny_vae), "--dim", "32", "--depth", "1", "--heads", "2",
              "--dim_head", "16", "--text_seq_len", "40", "--batch_size", "8", "--epochs", "1",
              "--log_every_n_steps", "1"]
    for name, data in (("images", ["--image_text_folder", str(folder),
                                   "--random_resize_crop_lower_ratio", "1"]),
                       ("tokens", ["--token_shards", str(tmp_path / "tokens")])):
        result = run_cli("train", *common, *data, "--dalle_output_file_name",
                         str(tmp_path / name))
        assert result.returncode == 0, result.stderr[-3000:]
    runs = [(metric_records(tmp_path / f"{n}.metrics.jsonl"),
             torch.load(tmp_path / f"{n}.pt", weights_only=True)["weights"])
            for n in ("images", "tokens")]
    assert [r["loss"] for r in runs[1][0]] == [r["loss"] for r in runs[0][0]]
    assert len(runs[0][0]) == 4
    assert all(torch.equal(runs[1][1][k], t) for k, t in runs[0][1].items())
    assert TokenShards(tmp_path / "tokens").keys() == TextImageFolder(folder, 16).keys()


def test_webdataset_shards_encode_as_they_are_and_a_bad_image_is_skipped(
        tiny_vae: Path, tmp_path: Path) -> None:
    """img2dataset-style .tar shards go in with --wds, as `train` takes them; an image
    member that does not decode is left out, named in the manifest and the log, and the
    rest train. The shards' keys are WebDataset training's held-out keys."""
    paths = write_shards(tmp_path / "wds", 2, 5)
    with tarfile.open(paths[1], "a") as tar:
        for ext, data in (("png", b"not an image"), ("txt", b"a broken sample")):
            info = tarfile.TarInfo(f"bad.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "tokens"
    encoded = run_cli("encode", "--image_text_folder", str(tmp_path / "wds"), "--wds",
                      "png,txt", "--vae_path", str(tiny_vae), "--shard_size", "4",
                      "--output", str(out))
    assert encoded.returncode == 0, encoded.stderr[-3000:]
    assert "10 samples in 3 shard(s)" in encoded.stdout
    assert "skipped 1 unreadable images, e.g. shard-001.tar/bad" in encoded.stdout
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["unreadable_images"] == ["shard-001.tar/bad"]
    assert manifest["skipped"] == ["ignored 2 samples without both members"]
    assert [s["samples"] for s in manifest["shards"]] == [4, 4, 2]  # 11 read, 1 left out
    assert TokenShards(out).keys() == [split_key(paths[s], f"{s:03d}{i:05d}")
                                       for s in range(2) for i in range(5)]
    trained = run_cli("train", "--token_shards", str(out), "--vae_path", str(tiny_vae),
                      "--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16",
                      "--text_seq_len", "24", "--batch_size", "5", "--epochs", "1",
                      "--dalle_output_file_name", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "10 samples in 3 shard(s)" in trained.stdout


def test_crops_and_flips_are_samples_of_their_own(shards: Path, tiny_vae: Path,
                                                  tmp_path: Path) -> None:
    """--crops 2 --flip: 4 samples per image, the first of each the plain encode's row,
    the rest crops and mirrors with their own keys, which the held-out split folds back
    onto the image's (a view never lands on the other side of its image). They train."""
    out = tmp_path / "views"
    encoded = run_cli("encode", "--vae_path", str(tiny_vae), *ENCODE, "--crops", "2",
                      "--flip", "--output", str(out))
    assert encoded.returncode == 0, encoded.stderr[-3000:]
    assert "320 samples in 3 shard(s)" in encoded.stdout
    views, plain = TokenShards(out), TokenShards(shards)
    assert len(views) == 4 * len(plain)
    assert views.sample_keys()[:4] == ["0", "0#0f", "0#1", "0#1f"]
    assert views.keys() == [key for key in plain.keys() for _ in range(4)]
    for i in (0, 37, 79):
        assert torch.equal(views[4 * i][0], plain[i][0]), i
        assert views[4 * i + 2][1] == plain[i][1]  # a view keeps its image's caption
    assert not torch.equal(views[1][0], views[0][0])
    trained = run_cli("train", "--token_shards", str(out), "--vae_path", str(tiny_vae),
                      "--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16",
                      "--text_seq_len", "40", "--batch_size", "64", "--epochs", "1",
                      "--val_fraction", "0.2", "--dalle_output_file_name", str(tmp_path / "r"))
    assert trained.returncode == 0, trained.stderr[-3000:]


def test_an_encode_that_cannot_write_or_would_overwrite_stops_in_one_line(
        shards: Path, tiny_vae: Path, tmp_path: Path) -> None:
    """--output below a file, or a folder holding another encode's manifest (here: other
    --shard_size): one error line, exit 2, nothing written."""
    (tmp_path / "file").write_text("x")
    result = run_cli("encode", "--vae_path", str(tiny_vae), *ENCODE, "--output",
                     str(tmp_path / "file" / "tokens"))
    assert_user_error(result, "cannot write to", "--output")
    before = files(shards)
    result = run_cli("encode", "--vae_path", str(tiny_vae), "--shapes_count", "80",
                     "--shard_size", "40", "--output", str(shards))
    assert_user_error(result, "holds token shards of another encode", "choose another --output")
    assert files(shards) == before
