"""No silent overwrite: a run whose output name already holds a checkpoint stops before it
writes anything, unless told to continue it (--resume auto) or to start over (--overwrite).

Without the check, the rerun would train and replace the old files at its first save
(DALLE-pytorch does, without a word): the byte-for-byte snapshots below would differ and
the refusal line would be missing.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from dalle_dist.data import DataConfig
from dalle_dist.train.builtin_vae import builtin_vae
from dalle_dist.train.config import RunPaths
from tests import launch
from tests.conftest import (
    TINY_DALLE_FLAGS,
    TINY_TRAIN_FLAGS,
    TINY_VAE_FLAGS,
    assert_user_error,
    run_cli,
)

VAE = ["train-vae", *TINY_VAE_FLAGS, *TINY_TRAIN_FLAGS, "--log_every_n_steps", "2"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def dalle(vae: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--vae_path", str(vae), *TINY_DALLE_FLAGS, *TINY_TRAIN_FLAGS,
            "--fidelity_images", "0", "--dalle_output_file_name", str(out), *extra]


def test_rerunning_a_finished_train_vae_stops_and_keeps_it(tmp_path: Path) -> None:
    args = [*VAE, "--vae_output_file_name", str(tmp_path / "vae")]
    assert run_cli(*args).returncode == 0
    before = snapshot(tmp_path)
    assert "vae.pt" in before and "vae.metrics.jsonl" in before

    stderr = assert_user_error(run_cli(*args), f"{tmp_path / 'vae.pt'} already holds a VAE "
                               "checkpoint at step 4 (epoch 1)", "--resume auto", "--overwrite")
    assert "replace" in stderr
    assert snapshot(tmp_path) == before, "nothing written, nothing removed"


def test_rerunning_train_stops_on_every_kind_of_checkpoint(tmp_path: Path, tiny_vae: Path
                                                           ) -> None:
    """NAME.pt, and NAME-checkpoints/ alone (the newest file deleted by hand)."""
    out = tmp_path / "w"
    assert run_cli(*dalle(tiny_vae, out, "--keep_n_checkpoints", "2")).returncode == 0
    (tmp_path / "w.pt").unlink()
    before = snapshot(tmp_path)
    assert_user_error(run_cli(*dalle(tiny_vae, out)),
                      f"{tmp_path / 'w-checkpoints' / 'step-0000004.pt'} already holds a "
                      "DALL-E checkpoint at step 4 (epoch 1)")
    assert snapshot(tmp_path) == before

    # Not a dalle_dist checkpoint at all (DALLE-pytorch's pickled dalle.pt, say): kept too.
    (tmp_path / "other.pt").write_bytes(b"PK\x03\x04 not ours")
    assert_user_error(run_cli(*dalle(tiny_vae, tmp_path / "other")),
                      "other.pt already exists and is not a readable dalle_dist checkpoint")
    assert (tmp_path / "other.pt").read_bytes() == b"PK\x03\x04 not ours"


def test_resume_auto_with_nothing_there_starts_fresh(tmp_path: Path) -> None:
    result = run_cli(*VAE, "--resume", "auto", "--vae_output_file_name", str(tmp_path / "v"))
    assert result.returncode == 0, result.stderr
    assert "--resume auto: no checkpoint of" in result.stdout
    assert torch.load(tmp_path / "v.pt", weights_only=True)["step"] == 4


def test_overwrite_and_resume_auto_contradict(tmp_path: Path) -> None:
    assert_user_error(run_cli(*VAE, "--resume", "auto", "--overwrite",
                              "--vae_output_file_name", str(tmp_path / "v")),
                      "--overwrite and --resume auto contradict each other")
    assert not list(tmp_path.iterdir())


def test_overwrite_keeps_the_old_checkpoint_until_the_new_one_is_saved(tmp_path: Path) -> None:
    """A start that fails before its first save (here: an empty image folder) loses
    nothing; one that saves replaces the old run's files, metrics and history included."""
    out = tmp_path / "vae"
    assert run_cli(*VAE, "--epochs", "2", "--keep_n_checkpoints", "3", "--log_every_n_steps",
                   "1", "--vae_output_file_name", str(out)).returncode == 0
    before = snapshot(tmp_path)
    assert "vae-checkpoints/step-0000008.pt" in before

    empty = tmp_path / "empty"
    empty.mkdir()
    assert_user_error(run_cli(*VAE, "--overwrite", "--image_folder", str(empty),
                              "--vae_output_file_name", str(out)), "no usable")
    assert snapshot(tmp_path) == before

    result = run_cli(*VAE, "--overwrite", "--vae_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    assert "--overwrite: " in result.stdout
    assert torch.load(tmp_path / "vae.pt", weights_only=True)["step"] == 4
    assert not (tmp_path / "vae-checkpoints").exists() or not list(
        (tmp_path / "vae-checkpoints").iterdir()), "the old run's history is gone"
    steps = launch.logged_steps(tmp_path / "vae.metrics.jsonl")
    assert steps == [2, 4], "the metrics are the new run's alone"


def test_overwrite_removes_an_old_deepspeed_directory(tmp_path: Path, tiny_vae: Path) -> None:
    """Left in place, the old run's NAME-ds-cp/ (step 8) would win `--resume auto` over the
    new run's NAME.pt (step 4): the new run would be lost at its first resume."""
    out = tmp_path / "d"
    first = launch.deepspeed(*dalle(tiny_vae, out, "--deepspeed", "--epochs", "2"), cwd=tmp_path)
    assert first.returncode == 0, launch.output(first)[-3000:]
    assert (tmp_path / "d-ds-cp" / "latest").exists()

    second = run_cli(*dalle(tiny_vae, out, "--overwrite"))
    assert second.returncode == 0, second.stderr
    assert "d-ds-cp (DeepSpeed directory) already holds a DALL-E checkpoint at step 8" in \
        second.stdout
    assert not (tmp_path / "d-ds-cp").exists()
    resumed = run_cli(*dalle(tiny_vae, out, "--resume", "auto", "--epochs", "2"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {tmp_path / 'd.pt'} at step 4" in resumed.stdout


def test_distributed_refusal_on_every_rank(tmp_path: Path, tiny_vae: Path) -> None:
    """The root decides (the output may be on its disk only) and every rank stops with the
    same line, at once: no rank goes on to wait for the others."""
    out = tmp_path / "d"
    assert run_cli(*dalle(tiny_vae, out)).returncode == 0
    before = snapshot(tmp_path)
    for flag in (["--distributed_backend", "torch"], ["--distributed_backend", "fsdp"],
                 ["--deepspeed"]):
        results = launch.bare_ranks(*dalle(tiny_vae, out, *flag), cwd=tmp_path, timeout=120)
        lines = {assert_user_error(r, "already holds a DALL-E checkpoint at step 4") for r in
                 results}
        assert len(lines) == 1, lines
    horovod = launch.horovodrun(*dalle(tiny_vae, out, "--distributed_backend", "horovod",
                                       "--batch_size", "8"), cwd=tmp_path, timeout=120)
    assert horovod.returncode != 0
    assert launch.output(horovod).count("already holds a DALL-E checkpoint at step 4") == 2
    assert snapshot(tmp_path) == before


def test_interrupted_builtin_vae_continues_from_its_partial_file(tmp_path: Path) -> None:
    """The cache's partial file is never replaced silently either: an interrupted built-in
    VAE training goes on from it, and only a finished one is cached."""
    cache = tmp_path / "cache"
    args = ["train", "--image_size", "8", "--builtin_vae_epochs", "1", *TINY_DALLE_FLAGS,
            *TINY_TRAIN_FLAGS, "--fidelity_images", "0"]
    spec = builtin_vae(DataConfig(image_size=8), cache, epochs=1)
    partial_metrics = RunPaths(spec.partial_path).metrics
    env = {**os.environ, "DALLE_DIST_CACHE": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "dalle_dist", *args,
                             "--dalle_output_file_name", str(tmp_path / "a")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launch.wait_for_step(proc, partial_metrics, 20)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped by SIGTERM" in out, out
    stopped_at = torch.load(spec.partial_path, weights_only=True)["step"]
    assert stopped_at >= 20 and not spec.path.exists()

    started = time.monotonic()
    result = run_cli(*args, "--dalle_output_file_name", str(tmp_path / "b"), env=env)
    assert result.returncode == 0, result.stderr
    assert f"resuming {spec.partial_path} at step {stopped_at}" in result.stdout
    assert spec.path.exists() and not spec.partial_path.exists()
    print(f"the rest of the built-in VAE took {time.monotonic() - started:.1f} s")
