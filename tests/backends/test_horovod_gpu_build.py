"""Horovod on CUDA (issue 24, item 1): a CUDA torch gets a Horovod with NCCL operations, its
wheel is cached apart from a CPU build's, and a Horovod without GPU operations is refused on
a GPU before a launch.

Bugs these catch:
- scripts/build_horovod.sh building Gloo only for a CUDA torch: the first collective on a
  GPU tensor then fails with "Requested ReadyEvent with GPU device but not compiled with
  CUDA";
- a cache key without the GPU operations, so `make test`'s CPU wheel is reused on a GPU
  machine;
- the horovod verdict calling a CPU-only Horovod usable on CUDA (`check` and `train` would
  let the run start).

The script runs for real, with a stand-in interpreter that answers its questions about
torch and records the pip calls (no build: the wheels are placed in its cache); the verdict
is asked of the Horovod this suite builds, which has no GPU operations.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_horovod.sh"
CPU_KEY = "horovod-0.28.1-torch-2.13.0-cp311"

FAKE_PYTHON = """#!/usr/bin/env bash
# Answers build_horovod.sh's questions about torch; records pip and Horovod checks.
case "$*" in
  *"torch.__version__"*) echo 2.13.0 ;;
  *"torch.version.cuda"*) echo "$FAKE_CUDA" ;;
  *"sys.version_info"*) echo cp311 ;;
  *"-m pip"*) echo "pip $*" >> "$FAKE_LOG" ;;
  *hvd*) echo "hvd-check $*" >> "$FAKE_LOG" ;;
esac
"""


def _run(tmp_path: Path, cuda: str, gpu_ops: str | None = None, wheels: tuple[str, ...] = (
        CPU_KEY, CPU_KEY + "-gpu-NCCL")) -> tuple[subprocess.CompletedProcess, str]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    cache = tmp_path / "wheels"
    for key in wheels:
        (cache / key).mkdir(parents=True, exist_ok=True)
        (cache / key / f"horovod-0.28.1-{key}.whl").write_text("")
    log = tmp_path / "log.txt"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "HOROVOD_GPU_OPERATIONS"}
    env.update(FAKE_CUDA=cuda, FAKE_LOG=str(log), DALLE_DIST_WHEELS=str(cache),
               CUDA_HOME=str(tmp_path / "no-cuda"), PATH="/usr/bin:/bin")
    if gpu_ops is not None:
        env["HOROVOD_GPU_OPERATIONS"] = gpu_ops
    done = subprocess.run(["bash", str(SCRIPT), str(python)], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    return done, log.read_text()


def test_a_cuda_torch_gets_the_nccl_wheel_and_its_check(tmp_path: Path) -> None:
    done, log = _run(tmp_path, cuda="12.8")
    assert done.returncode == 0, done.stderr
    installed = [line for line in log.splitlines() if " install " in line and ".whl" in line]
    assert len(installed) == 1 and f"{CPU_KEY}-gpu-NCCL/" in installed[0], log
    assert "nccl_built()" in log  # the installed wheel is asked for its NCCL operations


@pytest.mark.parametrize("cuda, gpu_ops", [("", None), ("12.8", "")],
                         ids=["cpu torch", "cuda torch, GPU operations turned off"])
def test_a_cpu_build_keeps_its_own_key(tmp_path: Path, cuda: str, gpu_ops: str | None) -> None:
    done, log = _run(tmp_path, cuda=cuda, gpu_ops=gpu_ops)
    assert done.returncode == 0, done.stderr
    installed = [line for line in log.splitlines() if " install " in line and ".whl" in line]
    assert len(installed) == 1 and f"{CPU_KEY}/" in installed[0], log
    assert "nccl_built()" not in log


def test_a_cuda_torch_without_nvcc_stops_before_building(tmp_path: Path) -> None:
    """No cached NCCL wheel and no CUDA toolkit: one message saying what to install (or how
    to build without GPU operations), before anything is downloaded."""
    done, log = _run(tmp_path, cuda="12.8", wheels=(CPU_KEY,))
    assert done.returncode == 1
    assert "nvcc" in done.stderr and "HOROVOD_GPU_OPERATIONS=" in done.stderr
    assert "download" not in log


def test_a_horovod_without_gpu_operations_is_refused_on_cuda() -> None:
    import horovod.torch as hvd  # make test builds it: Gloo, no GPU operations

    from dalle_dist.backends.horovod import HorovodBackend

    assert not hvd.cuda_built()
    on_gpu = HorovodBackend.verdict(cuda=True)
    assert not on_gpu.usable and "without GPU operations" in on_gpu.reason
    assert "scripts/build_horovod.sh" in on_gpu.fix
    assert HorovodBackend.verdict(cuda=False).usable
