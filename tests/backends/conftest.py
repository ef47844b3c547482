"""Runs shared by the equivalence and precision tests: each (backend, precision) trains once
per session, so precision runs are compared bit for bit with the same backend's fp32 run."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests import launch
from tests.backends.runs import BATCH, COMMON, RUNS, Run, batch_flag, metric_records
from tests.conftest import run_cli


@pytest.fixture(scope="session")
def trained(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Callable[..., Run]:
    """(backend name or "single", precision, *extra flags) -> its finished `train` run,
    trained on first use: 2 ranks (1 for single), global batch 16, 5 steps, metrics every
    step, a sample grid every 2 steps (sharded engines gather their weights mid-run for it)."""
    done: dict[tuple[str, ...], Run] = {}

    def get(name: str, precision: str, *extra: str) -> Run:
        key = (name, precision, *extra)
        if key in done:
            return done[key]
        # (a flag's value may be a path: keep the folder name one path component)
        label = re.sub(r"[^\w.,-]+", "_", f"{name}-{precision}{''.join(extra)}")[:120]
        folder = tmp_path_factory.mktemp(label)
        args = ["train", "--vae_path", str(tiny_vae), *COMMON, "--precision", precision,
                "--sample_every_n_steps", "2", "--dalle_output_file_name", str(folder / "dalle"),
                *extra]
        if name == "single":
            result = run_cli(*args, "--batch_size", str(BATCH), cwd=folder)
        else:
            launcher, flags = RUNS[name]
            result = launcher(*args, *flags, *batch_flag(name, BATCH), cwd=folder)
        text = launch.output(result)
        assert result.returncode == 0, text[-4000:]
        done[key] = Run(text, metric_records(folder / "dalle.metrics.jsonl"),
                        torch.load(folder / "dalle.pt", weights_only=True), folder)
        return done[key]
    return get
