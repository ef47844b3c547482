"""The CUDA math settings (train/cuda_settings.py) as train, train-vae and generate make
them: TF32 unless --no_tf32, and cuDNN's autotuning unless torch's deterministic mode is on.

No GPU is needed: the switches are process-wide torch settings that read back on a CPU
build, and a `cuda` device object reaches them without touching a GPU. Every test puts
them back as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dalle_dist.backends import SingleBackend
from dalle_dist.checkpoint.rng import capture_rng, restore_rng
from dalle_dist.cli import build_parser
from dalle_dist.cli.generate_cmd import generate_job
from dalle_dist.cli.parser import subcommand_parser
from dalle_dist.errors import CheckpointError
from dalle_dist.generate import GenerateConfig, generate
from dalle_dist.train.commands import RunSetup
from dalle_dist.train.config import ResumeConfig, RunPaths, TrainConfig
from dalle_dist.train.cuda_settings import TF32_ON, set_cudnn_benchmark
from dalle_dist.train.run_log import RunLog

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def _settings() -> tuple[str, bool, bool]:
    return (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark)


@pytest.fixture
def restored() -> Iterator[None]:
    """Start from TF32 and autotuning off; put everything back after."""
    before = _settings()
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled(),
                     torch.backends.cudnn.deterministic)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.benchmark = False
    yield
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    torch.backends.cudnn.deterministic = deterministic[2]
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = before[1:]


def test_cudnn_autotunes_on_cuda_except_in_deterministic_mode(restored: None) -> None:
    """Fails if benchmark stays off on CUDA, or is turned on in deterministic mode (where a
    resumed run must repeat an uninterrupted one), or on CPU."""
    assert not set_cudnn_benchmark(CPU) and not torch.backends.cudnn.benchmark
    assert set_cudnn_benchmark(CUDA) and torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic = True
    assert not set_cudnn_benchmark(CUDA) and not torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic = False
    assert set_cudnn_benchmark(CUDA)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as selftest's resume check
    assert not set_cudnn_benchmark(CUDA) and not torch.backends.cudnn.benchmark


def test_training_setup_sets_tf32_and_autotuning(restored: None, tmp_path: Path) -> None:
    """train and train-vae both start with RunSetup.begin (which also seeds the RNGs:
    theirs are put back for the tests that follow)."""
    lines: list[str] = []
    log = RunLog(None, True)
    log.info = lines.append  # type: ignore[method-assign]
    streams = capture_rng()
    try:
        RunSetup.begin("vae", "--vae_output_file_name", SingleBackend.on(CUDA), TrainConfig(),
                       ResumeConfig(), RunPaths.for_output(str(tmp_path / "vae")), log)
    finally:
        restore_rng(streams)
    assert _settings() == ("high", True, True)
    assert TF32_ON in lines


def test_generate_sets_what_train_sets(restored: None, tmp_path: Path) -> None:
    """generate's fp32 (its VAE decode, an fp32 DALL-E) runs with train's settings, and
    --no_tf32 reaches it from the command line. Fails if generate leaves them alone (a
    missing checkpoint stops it right after they are made)."""
    for tf32, expected in ((False, ("highest", False, True)), (True, ("high", True, True))):
        lines: list[str] = []
        with pytest.raises(CheckpointError):
            generate(str(tmp_path / "missing.pt"), ["a red circle"], str(tmp_path / "out"),
                     GenerateConfig(), CUDA, lines.append, tf32=tf32)
        assert _settings() == expected
        assert (TF32_ON in lines) == tf32
    parser = subcommand_parser(build_parser(), "generate")
    required = ["--dalle_path", "d.pt", "--text", "a"]
    assert generate_job(parser.parse_args(required)).no_tf32 is False
    assert generate_job(parser.parse_args([*required, "--no_tf32"])).no_tf32 is True
