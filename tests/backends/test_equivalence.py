"""Every backend on 2 CPU ranks against one process: same data, same parameters.

2 ranks x batch b and 1 process x batch 2b see the same samples each step (one
DistributedSampler for all backends), so after 5 steps of fp32 training the parameters
must agree to float rounding. Tolerance: rtol 1e-4, atol 1e-5 (observed: < 1e-6).
Each run also shows that all ranks hold identical parameters (the digest line the loop
prints after all-gathering every rank's hash).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests import launch
from tests.conftest import TINY_DALLE_FLAGS, TINY_VAE_FLAGS, run_cli

STEPS = 5
BATCH = 16  # global; 8 per rank
COMMON = [*TINY_DALLE_FLAGS, "--epochs", "1", "--shapes_count", str(STEPS * BATCH),
          "--fidelity_images", "0", "--learning_rate", "3e-3"]
RTOL, ATOL = 1e-4, 1e-5

Launcher = Callable[..., "launch.subprocess.CompletedProcess[str]"]
RUNS: dict[str, tuple[Launcher, list[str]]] = {
    "torch": (launch.torchrun, ["--distributed_backend", "torch"]),
    "fsdp": (launch.torchrun, ["--distributed_backend", "fsdp"]),
    **{f"deepspeed-zero{stage}": (launch.deepspeed, ["--deepspeed", "--zero_stage", str(stage)])
       for stage in range(4)},
    "horovod": (launch.horovodrun, ["--distributed_backend", "horovod"]),
}


def batch_flag(name: str, global_batch: int) -> list[str]:
    """Horovod's --batch_size is per worker; every other backend's is global."""
    return ["--batch_size", str(global_batch // 2 if name == "horovod" else global_batch)]


def digest_line(text: str) -> re.Match[str] | None:
    return re.search(r"parameters identical on (\d+) rank\(s\): digest ([0-9a-f]{16})", text)


@pytest.fixture(scope="module")
def single_weights(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("single") / "dalle"
    result = run_cli("train", "--vae_path", str(tiny_vae), *COMMON, "--batch_size", str(BATCH),
                     "--dalle_output_file_name", str(out))
    assert result.returncode == 0, result.stderr
    payload = torch.load(out.with_suffix(".pt"), weights_only=True)
    assert payload["step"] == STEPS
    return payload["weights"]


@pytest.mark.parametrize("name", list(RUNS))
def test_two_ranks_equal_one_process(name: str, tiny_vae: Path, tmp_path: Path,
                                     single_weights: dict[str, torch.Tensor]) -> None:
    launcher, flags = RUNS[name]
    # Sample grids every 2 steps: sharded engines gather their weights mid-run for them.
    result = launcher("train", "--vae_path", str(tiny_vae), *COMMON, *flags,
                      *batch_flag(name, BATCH), "--sample_every_n_steps", "2",
                      "--dalle_output_file_name", str(tmp_path / "dalle"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-4000:]
    match = digest_line(text)
    assert match and match.group(1) == "2", "all ranks must report the same parameters"
    assert "global batch 16 = 8 per rank x 2 ranks" in text
    payload = torch.load(tmp_path / "dalle.pt", weights_only=True)
    assert payload["step"] == STEPS and payload["world_size"] == 2
    assert payload["backend"] == name.split("-")[0]
    for key, expected in single_weights.items():
        got = payload["weights"][key].float()
        assert torch.allclose(got, expected, rtol=RTOL, atol=ATOL), (
            key, (got - expected).abs().max().item())
    assert len(list((tmp_path / "dalle-samples").glob("step-*.png"))) == 2


@pytest.mark.parametrize("name", ["torch", "fsdp", "deepspeed-zero3", "horovod"])
def test_train_vae_on_two_ranks(name: str, tmp_path: Path) -> None:
    launcher, flags = RUNS[name]
    result = launcher("train-vae", *TINY_VAE_FLAGS, *flags, *batch_flag(name, 16),
                      "--epochs", "1", "--shapes_count", "64", "--sample_every_n_steps", "2",
                      "--vae_output_file_name", str(tmp_path / "vae"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-4000:]
    match = digest_line(text)
    assert match and match.group(1) == "2"
    payload = torch.load(tmp_path / "vae.pt", weights_only=True)
    assert payload["kind"] == "vae" and payload["step"] == 64 // 16
    assert len(list((tmp_path / "vae-samples").glob("step-*.png"))) == 2
