"""Launches that several test files read: the probed runs (one `train` launch per backend
under tests/backends/sync_probe.py, read by tests/backends/test_host_syncs.py for host
syncs and collectives per step and tests/backends/test_clipping.py for the first step
against one clipped by hand) and the shared-layers runs with gradient accumulation (read
by tests/backends/test_sharing.py and tests/backends/test_accumulation.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import launch
from tests.backends.runs import GA, RUNS, SHARED, Run, batch_flag
from tests.conftest import TINY_DALLE_FLAGS, build_once

ROOT = Path(__file__).resolve().parents[2]
#: 7 steps of 2 micro-batches, a metrics line every 3 (tests/backends/test_host_syncs.py)
PROBED_STEPS, PROBED_LOG_EVERY = 7, 3
#: Far below the gradient's norm (about 4): the clipped step is unlike the unclipped one
#: (tests/backends/test_clipping.py says why Adam needs that).
PROBED_MAX_NORM = 1e-6
PROBED = ["single", "torch", "fsdp", "deepspeed-zero0", "deepspeed-zero2", "deepspeed-zero3",
          "horovod"]


@pytest.fixture(scope="session")
def probed_run(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Callable[[str], Path]:
    """backend name -> the folder of its probed run (rank<N>.json, clip.json), launched on
    first use, once per test run; 2 ranks (1 for single), global batch 16."""
    def get(name: str) -> Path:
        def build(folder: Path) -> None:
            args = ["train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--epochs", "1",
                    "--shapes_count", str(PROBED_STEPS * 16), "--fidelity_images", "0",
                    "--log_every_n_steps", str(PROBED_LOG_EVERY), "--sample_every_n_steps",
                    "0", "--ga_steps", "2", "--learning_rate", "3e-3",
                    "--clip_grad_norm", str(PROBED_MAX_NORM),
                    "--dalle_output_file_name", str(folder / "dalle")]
            env = {"SYNC_PROBE_DIR": str(folder), "CLIP_PROBE_DIR": str(folder),
                   "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            module = "tests.backends.sync_probe"
            if name == "single":
                cmd = [launch.sys.executable, "-m", module, *args, "--batch_size", "16"]
            else:
                launcher, flags = RUNS[name]
                cmd = launch.command(launcher.__name__, *args, *flags, *batch_flag(name, 16),
                                     module=module)
            result = launch._run(cmd, folder, env, launch.LAUNCH_TIMEOUT)
            text = launch.output(result)
            assert result.returncode == 0, text[-4000:]
        return build_once(tmp_path_factory, f"probed-{name}", build)
    return get


@pytest.fixture(scope="session")
def shared_ga_run(trained: Callable[..., Run], tmp_path_factory: pytest.TempPathFactory
                  ) -> Callable[[str], Run]:
    """backend name or "single" -> its `trained` run with SHARED and --ga_steps 4: one
    launch per backend read by tests/backends/test_sharing.py and
    tests/backends/test_accumulation.py, against trained("single", "fp32", *SHARED).

    ZeRO-3 runs with stage3_param_persistence_threshold 0, so that even this tiny model's
    parameters are partitioned and gathered (by default those under 1e5 elements stay
    whole and the run would not reach ZeRO-3's gathering at all)."""
    def write(folder: Path) -> None:
        config = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}
        (folder / "partition_all.json").write_text(json.dumps(config))

    partition_all = build_once(tmp_path_factory, "zero3_partition_all", write)

    def get(name: str) -> Run:
        extra = (*SHARED, *GA)
        if name == "deepspeed-zero3":
            extra = (*extra, "--deepspeed_config", str(partition_all / "partition_all.json"))
        return trained(name, "fp32", *extra)
    return get
