"""`dalle-dist check` in real environments built here, and `train` stopping with its verdict.

Each environment is a venv whose site-packages holds links to the real packages of the
test venv, less the engines it should lack, plus real packages where one is added (the
unrelated PyPI `apex`, installed from PyPI into the overlay). Nothing stands in for an
engine: DeepSpeed and Horovod are either really there or really absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli

SITE = Path(sysconfig.get_paths()["purelib"])


def overlay_env(root: Path, without: tuple[str, ...] = (), extra: Path | None = None) -> Path:
    """A venv of the same interpreter holding the test venv's packages except `without`."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)],
                   check=True)
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages"
    for entry in SITE.iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top in without:
            continue
        (site / entry.name).symlink_to(entry)
    for entry in (extra.iterdir() if extra else ()):
        (site / entry.name).symlink_to(entry)
    return root / "bin" / "python"


def run(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-m", "dalle_dist", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300, check=False)


def check_json(python: Path, *args: str) -> tuple[int, dict]:
    result = run(python, "check", "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture(scope="module")
def no_engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return overlay_env(tmp_path_factory.mktemp("env") / "no-engines",
                       without=("deepspeed", "horovod"))


@pytest.fixture(scope="module")
def pypi_apex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package PyPI calls apex (a Pyramid toolkit, not NVIDIA's), really installed."""
    target = tmp_path_factory.mktemp("apex-target")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), "apex==0.9.10dev"], check=True, timeout=300)
    return overlay_env(tmp_path_factory.mktemp("env") / "pypi-apex", extra=target)


def test_without_deepspeed_its_verdict_names_the_extra(no_engines: Path) -> None:
    status, info = check_json(no_engines, "--backend", "deepspeed")
    assert status == 1
    assert info["engines"]["deepspeed"]["installed"] is False
    verdict = info["backends"]["deepspeed"]
    assert verdict["usable"] is False
    assert "DeepSpeed is not importable" in verdict["reason"]
    assert verdict["fix"] == "pip install 'dalle_dist[deepspeed]'"
    assert info["requested"] == {"backend": "deepspeed", "precision": "fp32", "usable": False}
    # The other backends are still usable, and the default request passes.
    assert all(info["backends"][name]["usable"] for name in ("single", "torch", "fsdp"))
    assert check_json(no_engines)[0] == 0


def test_without_horovod_the_fix_is_the_build_script(no_engines: Path) -> None:
    status, info = check_json(no_engines, "--backend", "horovod")
    assert status == 1
    assert info["engines"]["horovod"]["installed"] is False
    assert "scripts/build_horovod.sh" in info["backends"]["horovod"]["fix"]


def test_train_stops_at_once_with_the_same_verdict(no_engines: Path, tmp_path: Path) -> None:
    _, info = check_json(no_engines, "--backend", "deepspeed")
    verdict = info["backends"]["deepspeed"]
    result = run(no_engines, "train", *TINY_DALLE_FLAGS, "--deepspeed",
                 "--dalle_output_file_name", str(tmp_path / "d"))
    assert_user_error(result, f"backend deepspeed cannot run here: {verdict['reason']}",
                      verdict["fix"], "dalle-dist check --backend deepspeed")
    assert not list(tmp_path.iterdir()), "nothing written"


def test_with_deepspeed_installed() -> None:
    status, info = check_json(Path(sys.executable), "--backend", "deepspeed")
    assert status == 0
    ds = info["engines"]["deepspeed"]
    assert ds["importable"] and ds["version"] and ds["accelerator"] == "cpu"
    assert "fused_adam" in ds["ops"] and set(ds["ops"]["fused_adam"]) == {"prebuilt",
                                                                           "compatible"}
    assert ds["sparse_attention"].startswith("absent")  # DeepSpeed >= 0.19.7 has none
    assert info["backends"]["deepspeed"] == {"usable": True, "reason": "", "fix": ""}


def test_fp16_with_deepspeed_on_cpu_is_refused_by_check_and_by_train(tmp_path: Path) -> None:
    status, info = check_json(Path(sys.executable), "--backend", "deepspeed",
                              "--precision", "fp16")
    assert status == 1
    verdict = info["precisions"]["deepspeed"]["fp16"]
    assert verdict == {"usable": False, "reason": "DeepSpeed cannot train fp16 on CPU",
                       "fix": "use --precision bf16"}
    assert info["precisions"]["deepspeed"]["bf16"]["usable"] is True
    result = run(Path(sys.executable), "train", *TINY_DALLE_FLAGS, "--deepspeed", "--fp16",
                 "--dalle_output_file_name", str(tmp_path / "d"))
    # A single process without a launcher: the precision verdict comes first.
    assert_user_error(result, verdict["reason"], verdict["fix"])


def test_horovod_built_here_reports_its_own_api() -> None:
    status, info = check_json(Path(sys.executable), "--backend", "horovod")
    assert status == 0
    hv = info["engines"]["horovod"]
    assert hv["torch_built"] is True and hv["version"] == "0.28.1"
    assert hv["controllers"] == {"gloo": True, "mpi": False}
    assert hv["tensor_operations"]["gloo"] is True and hv["tensor_operations"]["nccl"] is False


def test_the_unrelated_pypi_apex_is_told_apart(pypi_apex: Path) -> None:
    _, info = check_json(pypi_apex)
    apex = info["engines"]["apex"]
    assert apex["state"] == "unrelated", apex
    assert "Pyramid" in apex["summary"]
    text = run(pypi_apex, "check").stdout
    assert "the unrelated PyPI package named apex" in text


def test_human_report_and_cuda_smoke_on_a_cpu_machine() -> None:
    result = run(Path(sys.executable), "check", "--cuda-smoke")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for heading in ("python", "torch", "torch.distributed", "/dev/shm", "deepspeed",
                    "horovod", "apex", "triton", "flex attention", "sdpa kernels",
                    "torch.compile inductor on cpu: ready"):
        assert any(line.startswith(heading) for line in text.splitlines()), heading
    assert "requested: single fp32: usable" in text
    assert "cuda smoke: failed: no CUDA device" in text


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    """One `error:` line naming the bad value and the known backends, no report printed
    (fails if check probes the environment or prints before validating --backend) and
    nothing written where it ran."""
    result = run_cli("check", "--backend", "mpi", cwd=tmp_path)
    assert_user_error(result, "--backend", "'mpi'", "single", "deepspeed", "horovod")
    assert result.stdout == "", result.stdout
    assert not list(tmp_path.iterdir()), "nothing written"
