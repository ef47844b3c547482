"""The default path on every backend: built-in data, no --vae_path, no optional flag but
tiny sizes, through the real launchers with 2 ranks, with an empty and then a filled VAE
cache.

This is where Horovod hung for good: rank 0 broadcast the cached VAE (a dict) while rank 1
broadcast None, and Horovod named the two collectives after their types, so they never
met. Every other test passed --vae_path. A rank that takes another path than the others
here hangs until the launch's timeout (or, with the bound, fails with a named wait).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from tests import launch
from tests.backends.runs import assert_ranks_consistent
from tests.conftest import run_cli, saved_checkpoint

BACKENDS = ("single", "torch", "fsdp", "deepspeed", "horovod")
DATA = ["--epochs", "1", "--shapes_count", "64", "--image_size", "8"]
DALLE = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16",
         "--builtin_vae_epochs", "1", "--fidelity_images", "2"]


def run(backend: str, *args: str, cwd: Path, env: dict[str, str]
        ) -> subprocess.CompletedProcess[str]:
    """`dalle-dist ARGS` as a user starts it for `backend`, 2 ranks where distributed."""
    if backend == "single":
        return run_cli(*args, cwd=cwd, env=env, timeout=launch.LAUNCH_TIMEOUT)
    if backend == "deepspeed":
        return launch.deepspeed(*args, "--deepspeed", cwd=cwd, env=env)
    if backend == "horovod":  # --batch_size per worker: the same 16 samples a step
        return launch.horovodrun(*args, "--distributed_backend", "horovod", "--batch_size",
                                 "8", cwd=cwd, env=env)
    return launch.torchrun(*args, "--distributed_backend", backend, cwd=cwd, env=env)


def succeeded(result: subprocess.CompletedProcess[str], backend: str) -> str:
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    assert_ranks_consistent(backend, text, world=1 if backend == "single" else 2)
    return text


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_path(backend: str, tmp_path: Path) -> None:
    env = {"DALLE_DIST_CACHE": str(tmp_path / "cache")}
    batch = ["--batch_size", "16"]

    text = succeeded(run(backend, "train-vae", *DATA, *batch, cwd=tmp_path, env=env), backend)
    assert saved_checkpoint(tmp_path / "vae.pt")["backend"] == backend

    text = succeeded(run(backend, "train", *DATA, *batch, *DALLE, "--dalle_output_file_name",
                         "first", cwd=tmp_path, env=env), backend)
    assert text.count("no --vae_path given: training a VAE on built-in shapes first") == 1
    assert "caption fidelity: " in text
    cached = list((tmp_path / "cache" / "vae").glob("shapes-8px-*.pt"))
    assert [p.name for p in cached if "partial" in p.name] == [], "renamed when finished"
    assert len(cached) == 1

    text = succeeded(run(backend, "train", *DATA, *batch, *DALLE, "--dalle_output_file_name",
                         "second", cwd=tmp_path, env=env), backend)
    assert text.count("no --vae_path given: using the cached built-in VAE") == 1
    assert "training a VAE" not in text
    first, second = (saved_checkpoint(tmp_path / f"{name}.pt") for name in ("first", "second"))
    for name, tensor in first["vae_weights"].items():
        assert torch.equal(tensor, second["vae_weights"][name]), name

