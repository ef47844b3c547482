"""--precision on every backend: bf16 trains on 2 CPU ranks everywhere (DeepSpeed through its
bf16 section, the others through autocast), and --amp says what it falls back to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests import launch
from tests.backends.test_equivalence import RUNS, batch_flag, digest_line
from tests.conftest import TINY_DALLE_FLAGS, run_cli

BF16_RUNS = ["torch", "fsdp", "deepspeed-zero2", "horovod"]


@pytest.mark.parametrize("name", BF16_RUNS)
def test_bf16_trains_on_two_ranks(name: str, tiny_vae: Path, tmp_path: Path) -> None:
    launcher, flags = RUNS[name]
    result = launcher("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, *flags,
                      *batch_flag(name, 16), "--precision", "bf16", "--epochs", "2",
                      "--shapes_count", "64", "--learning_rate", "3e-3",
                      "--log_every_n_steps", "1", "--fidelity_images", "0",
                      "--dalle_output_file_name", str(tmp_path / "dalle"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    match = digest_line(text)
    assert match and match.group(1) == "2"
    losses = [json.loads(line)["loss"]
              for line in (tmp_path / "dalle.metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], "bf16 training still learns"
    weights = torch.load(tmp_path / "dalle.pt", weights_only=True)["weights"]
    assert all(torch.isfinite(w.float()).all() for w in weights.values())


def test_amp_on_cpu_falls_back_to_native_fp16_and_says_so(tiny_vae: Path, tmp_path: Path
                                                          ) -> None:
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--amp",
                     "--epochs", "1", "--batch_size", "16", "--shapes_count", "64",
                     "--fidelity_images", "0", "--dalle_output_file_name", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("--amp:")]
    assert lines == ["--amp: Apex amp needs CUDA and this run is on cpu; using torch.autocast "
                     "fp16 with a gradient scaler instead"]
