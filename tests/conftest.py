"""Shared test plumbing: one way to run the CLI as a real process, and tiny checkpoints.

Tiny models keep the suite fast; the trained-for-real demo VAE lives in
tests/train/test_builtin_vae.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

TINY_VAE_FLAGS = [
    "--image_size", "16", "--num_layers", "2", "--num_tokens", "32", "--emb_dim", "16",
    "--hidden_dim", "16", "--num_resnet_blocks", "0",
]
TINY_DALLE_FLAGS = [
    "--dim", "32", "--depth", "2", "--heads", "2", "--dim_head", "16", "--text_seq_len", "40",
]
TINY_TRAIN_FLAGS = ["--epochs", "1", "--batch_size", "16", "--shapes_count", "64"]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """`python -m dalle_dist ARGS` in a fresh process, as a user would run it.

    prefix wraps the command (e.g. setpriv to drop root's privileges).
    """
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*prefix, sys.executable, "-m", "dalle_dist", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=full_env, check=False)


def assert_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """DESIGN.md's contract: exit 2, exactly one line `error: ...` on stderr, no traceback."""
    stderr = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith("error: "), stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)
    return stderr


@pytest.fixture(scope="session")
def tiny_vae(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A VAE checkpoint trained for a few steps on 16px shapes, through the CLI."""
    out = tmp_path_factory.mktemp("tiny_vae") / "vae.pt"
    result = run_cli("train-vae", *TINY_VAE_FLAGS, *TINY_TRAIN_FLAGS,
                     "--vae_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def tiny_dalle(tmp_path_factory: pytest.TempPathFactory, tiny_vae: Path) -> Path:
    """A DALL-E checkpoint trained for a few steps on top of tiny_vae, through the CLI."""
    out = tmp_path_factory.mktemp("tiny_dalle") / "dalle.pt"
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, *TINY_TRAIN_FLAGS,
                     "--fidelity_images", "4", "--dalle_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    return out


#: A torch extension build that left its lock this long ago was killed mid-build; torch's
#: FileBaton would wait for that lock forever.
STALE_LOCK_S = 30 * 60


@pytest.fixture(scope="session", autouse=True)
def deepspeed_cpu_ops() -> Iterator[None]:
    """DeepSpeed on CPU compiles its shared-memory comm op on first use (1-3 minutes on two
    cores, again for every venv path): build it once here, so no launch's timeout absorbs
    the compile, and clear locks that a killed build left behind."""
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR",
                                Path.home() / ".cache" / "torch_extensions"))
    for lock in cache.glob("*/*/lock"):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
    code = ("from dalle_dist.ds_checkpoint import quiet_output\n"
            "with quiet_output():\n"
            "    from deepspeed.accelerator import get_accelerator\n"
            "    builder = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
            "    builder is None or builder.load()\n")
    subprocess.run([sys.executable, "-c", code], timeout=1200, check=True)
    started = time.time()
    yield
    # Ranks killed by the tests cannot remove their DeepSpeed shared-memory buffers.
    for leftover in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"):
        if leftover.stat().st_mtime >= started:
            leftover.unlink(missing_ok=True)

