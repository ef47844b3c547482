"""The built-in VAE that `train` trains (or reuses) without --vae_path: the demo's first half.

Trained for real, for three of the demo's five epochs (--builtin_vae_epochs 3: the same
shapes, model, schedule and code path, 60% of the steps): its reconstructions must already
keep the scorer's verdict, or caption fidelity would measure the VAE rather than DALL-E.
Measured: 3 epochs keep it on 0.946 of the held-out images, 2 on 0.838, 1 on 0.134.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dalle_dist.data.scorer import predict
from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.model import DiscreteVAE, VAEConfig
from dalle_dist.train.cpu_settings import HEAP_KEPT
from tests.conftest import run_cli

TRAIN_FLAGS = ["--epochs", "1", "--shapes_count", "64", "--batch_size", "16", "--dim", "32",
               "--depth", "1", "--fidelity_images", "8", "--builtin_vae_epochs", "3"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """A fresh cache, filled by the first `train` run; returns (cache dir, its stdout, the
    DALL-E checkpoint it wrote)."""
    cache_dir = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("first") / "dalle"
    result = run_cli("train", *TRAIN_FLAGS, "--dalle_output_file_name", str(out),
                     env={"DALLE_DIST_CACHE": str(cache_dir)}, timeout=900)
    assert result.returncode == 0, result.stderr
    return cache_dir, result.stdout, out.with_suffix(".pt")


def test_first_run_trains_and_caches_a_vae(cache: tuple[Path, str, Path]) -> None:
    cache_dir, stdout, _ = cache
    assert "no --vae_path given: training a VAE on built-in shapes first" in stdout
    # the VAE's loop kept the heap (train/cpu_settings.py); DALL-E's, in the same process,
    # says nothing more
    assert stdout.count(HEAP_KEPT) == 1 and stdout.index(HEAP_KEPT) < stdout.index(
        "training DALL-E"), stdout
    cached = list((cache_dir / "vae").glob("shapes-32px-*.pt"))
    assert len(cached) == 1 and ".partial" not in cached[0].name
    assert not list((cache_dir / "vae").glob("*.partial.*")), "the partial files were renamed"
    record = cached[0].with_suffix(".metrics.jsonl").read_text().splitlines()
    assert len(record) >= 3 and '"loss"' in record[-1]  # the VAE's training, kept beside it


def test_second_run_reuses_the_cache(cache: tuple[Path, str, Path], tmp_path: Path) -> None:
    cache_dir, _, first = cache
    before = {p: p.stat().st_mtime_ns for p in (cache_dir / "vae").glob("*.pt")}
    result = run_cli("train", *TRAIN_FLAGS, "--dalle_output_file_name", str(tmp_path / "d"),
                     env={"DALLE_DIST_CACHE": str(cache_dir)})
    assert result.returncode == 0, result.stderr
    assert "using the cached built-in VAE" in result.stdout
    assert "training a VAE" not in result.stdout
    after = {p: p.stat().st_mtime_ns for p in (cache_dir / "vae").glob("*.pt")}
    assert before == after
    # Same flags, same seed: the same DALL-E whether its VAE was trained in this process
    # first or read from the cache (training it must not move the run's RNG streams).
    trained_first = torch.load(first, weights_only=True)["weights"]
    from_cache = torch.load(tmp_path / "d.pt", weights_only=True)["weights"]
    assert trained_first.keys() == from_cache.keys()
    for name, tensor in trained_first.items():
        assert torch.equal(tensor, from_cache[name]), name


def test_reconstructions_keep_the_scorer_verdict(cache: tuple[Path, str, Path]) -> None:
    cache_dir, _, _ = cache
    payload = torch.load(next((cache_dir / "vae").glob("*.pt")), weights_only=True)
    vae = DiscreteVAE(VAEConfig.from_dict(payload["configs"]["model"]))
    vae.load_state_dict(payload["weights"])
    vae.eval()
    held_out = ShapesDataset(500, vae.config.image_size, seed=777)
    images = torch.stack([held_out[i][0] for i in range(len(held_out))])
    with torch.no_grad():
        recons = vae.decode(vae.get_codebook_indices(images))
    kept = sum(predict(a) == predict(b) for a, b in zip(images, recons, strict=True)) / 500
    print(f"VAE reconstructions keep the scorer's verdict on {kept:.3f} of 500 images")
    assert kept >= 0.9


def test_cache_key_of_the_default_vae_is_stable() -> None:
    """Every user's cached VAE is found by this key: a field added to DataConfig, VAEConfig,
    VAESchedule or TrainConfig changes it and silently retrains (about 2 minutes) on every
    machine. Change the expected name only on purpose (issue 12 nearly did it by accident)."""
    from dalle_dist.data import DataConfig
    from dalle_dist.train.builtin_vae import builtin_vae

    assert builtin_vae(DataConfig(), Path("c")).path == Path(
        "c/vae/shapes-32px-1cd54a0aef14.pt")


def test_shards_encoded_by_the_builtin_vae_train_without_vae_path(
        cache: tuple[Path, str, Path], tmp_path: Path) -> None:
    """`encode` on the shapes with no --vae_path uses the cached built-in VAE; `train
    --token_shards` finds it again from the manifest (image size, shapes seed) with no
    --vae_path, and trains the same DALL-E as the first run trained from the images.
    Caught: the token run choosing its VAE from its own default --image_size or seed, or
    the built-in VAE's cache key moved by the new data field (a second VAE trained)."""
    cache_dir, _, first = cache
    env = {"DALLE_DIST_CACHE": str(cache_dir)}
    encoded = run_cli("encode", "--shapes_count", "64", "--builtin_vae_epochs", "3",
                      "--output", str(tmp_path / "tokens"), env=env)
    assert encoded.returncode == 0, encoded.stderr
    assert "using the cached built-in VAE" in encoded.stdout
    result = run_cli("train", *TRAIN_FLAGS, "--token_shards", str(tmp_path / "tokens"),
                     "--dalle_output_file_name", str(tmp_path / "d"), env=env)
    assert result.returncode == 0, result.stderr
    assert "using the cached built-in VAE" in result.stdout
    assert len(list((cache_dir / "vae").glob("*.pt"))) == 1
    expected = torch.load(first, weights_only=True)["weights"]
    got = torch.load(tmp_path / "d.pt", weights_only=True)["weights"]
    assert all(torch.equal(got[k], t) for k, t in expected.items())
