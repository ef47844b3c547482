"""How the backend tests launch `train` on each engine, and what they read back from a run:
digest lines, metrics, checkpoints. Shared so that every comparison uses the same runs.

The torch and DeepSpeed runs start each rank through tests/backends/dtype_probe.py, which
adds one line to the output: the dtypes the first step's forward computed in
(tests/backends/test_precision.py compares DeepSpeed's with DDP's). It only records.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import launch
from tests.conftest import TINY_DALLE_FLAGS

STEPS = 5
BATCH = 16  # global; 8 per rank
#: AdamW with a warmup and a cosine decay on every backend: a decay each backend applied
#: to other parameters (DeepSpeed or FSDP losing the no-decay group), or a rate its
#: optimizer never saw, moves its weights off the single process's. Weight decay 0.5 at
#: these rates moves a weight by up to 7.5e-4 a step, well past the weights' tolerance.
OPTIMIZER = ("--optimizer", "adamw", "--weight_decay", "0.5", "--lr_schedule", "cosine",
             "--warmup_steps", "2", "--min_lr", "1e-3")
#: the rate each of the STEPS steps takes under OPTIMIZER at --learning_rate 3e-3 (the
#: warmup's 1/2 and 2/2, the peak, cosine's midpoint, the floor)
STEP_RATES = [1.5e-3, 3e-3, 3e-3, 2e-3, 1e-3]
#: an EMA on every backend: the weights themselves after step 1, then averaged with
#: decay 0.6 (a decay near 1 would leave it near the initial weights, where a backend that
#: never updated it would pass)
EMA_DECAY, EMA_START = 0.6, 1
EMA = ("--ema_decay", str(EMA_DECAY), "--ema_start_step", str(EMA_START))
COMMON = [*TINY_DALLE_FLAGS, "--epochs", "1", "--shapes_count", str(STEPS * BATCH),
          "--fidelity_images", "0", "--learning_rate", "3e-3", "--log_every_n_steps", "1",
          *OPTIMIZER, *EMA]
#: fp32 on 2 ranks against one process (observed: weights < 1e-6, grad norms < 1e-6 rel).
RTOL, ATOL = 1e-4, 1e-5

#: train --compile against eager (tests/train/test_compile.py, tests/backends/test_compile.py):
#: 20 optimizer steps of the `trained` runs (global batch 16), a sample grid every 10
TWENTY_STEPS = ("--shapes_count", "320", "--sample_every_n_steps", "10")
#: the default pattern and a masked one (axial_row: SDPA with its mask on this small grid,
#: the band paths from 12 x 12 cells), over 2 layers
COMPILE_PATTERNS = ("--attn_types", "full,axial_row")
#: fp32: a compiled step's kernels sum in another order than eager ones. Seen over 20
#: steps, one process and 2 ranks, inductor and aot_eager: losses and gradient norms 2e-7
#: apart (relative), weights 3.5e-7 (absolute) from one set of initial weights; from
#: another, one element of 3,072 was 2.6e-6 away on all four 2-rank backends alike (the
#: two ranks' mean of a near-zero gradient rounds differently from one process's, and
#: Adam divides that by the gradient's own small second moment). A block output off by
#: 1e-3 moved the losses by only 6.5e-6 (the layer norms absorb a scale) but the weights
#: by 2.3e-4: the weights are what can see a small error (off by 1e-4: 1.2e-5 away).
COMPILE_RTOL, COMPILE_WEIGHT_ATOL = 1e-5, 5e-6

Launcher = Callable[..., "launch.subprocess.CompletedProcess[str]"]
ROOT = Path(__file__).resolve().parents[2]
DTYPE_PROBE = "tests.backends.dtype_probe"


def dtype_probed(launcher: str) -> Launcher:
    """`launcher` (torchrun or deepspeed, as tests/launch.py names them) with every rank
    started as `python -m tests.backends.dtype_probe ARGS`."""
    def run(*args: str, nproc: int = 2, cwd: Path | None = None,
            env: dict[str, str] | None = None, timeout: float = launch.LAUNCH_TIMEOUT
            ) -> launch.subprocess.CompletedProcess[str]:
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        cmd = launch.command(launcher, *args, nproc=nproc, module=DTYPE_PROBE)
        return launch._run(cmd, cwd, {"PYTHONPATH": path, **(env or {})}, timeout)
    run.__name__ = launcher  # (tests/backends/conftest.py launches its probes by this name)
    return run


RUNS: dict[str, tuple[Launcher, list[str]]] = {
    "torch": (dtype_probed("torchrun"), ["--distributed_backend", "torch"]),
    "fsdp": (launch.torchrun, ["--distributed_backend", "fsdp"]),
    **{f"deepspeed-zero{stage}": (dtype_probed("deepspeed"),
                                  ["--deepspeed", "--zero_stage", str(stage)])
       for stage in range(4)},
    "horovod": (launch.horovodrun, ["--distributed_backend", "horovod"]),
}
SHARDED = {"fsdp", "deepspeed-zero3"}
#: Attention and feed-forward shared by layers 0 and 2, embeddings tied to the output
#: projection, every block checkpointed (tests/backends/test_sharing.py says why each).
SHARED = ("--depth", "3", "--shared_attn_ids", "0,1,0", "--shared_ff_ids", "f,g,f",
          "--share_input_output_emb", "--reversible")
#: 4 micro-batches per optimizer step (tests/backends/test_accumulation.py).
GA = ("--ga_steps", "4")


@dataclass
class Run:
    """One finished `train` run."""

    text: str  # everything the launcher and the ranks printed
    metrics: list[dict[str, Any]]  # NAME.metrics.jsonl
    payload: dict[str, Any]  # the single-file checkpoint
    folder: Path

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.metrics]

    @property
    def grad_norms(self) -> dict[int, float]:
        return norms_by_step(self.metrics)


def batch_flag(name: str, global_batch: int) -> list[str]:
    """Horovod's --batch_size is per worker; every other backend's is global."""
    return ["--batch_size", str(global_batch // 2 if name == "horovod" else global_batch)]


def metric_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def norms_by_step(records: list[dict[str, Any]]) -> dict[int, float]:
    """Each logged step's pre-clip gradient norm (--log_every_n_steps 1)."""
    return {int(r["step"]): r["grad_norm"] for r in records}


def grad_norms(path: Path) -> dict[int, float]:
    return norms_by_step(metric_records(path))


def digest_line(text: str) -> re.Match[str] | None:
    return re.search(r"parameters identical on (\d+) rank\(s\): digest ([0-9a-f]{16})", text)


def shard_digests(text: str) -> list[str]:
    match = re.search(r"parameters sharded over (\d+) rank\(s\): shard digests "
                      r"((?:[0-9a-f]{16} ?)+)", text)
    assert match, "a sharded run logs its shards' digests"
    digests = match.group(2).split()
    assert len(digests) == int(match.group(1))
    return digests


def assert_ranks_consistent(name: str, text: str, world: int = 2) -> None:
    """Replicas: one digest for all ranks (a rank that missed an update differs).
    Sharded: one digest per rank, all different (equal shards would mean the engine did
    not shard, or every rank hashed the same gathered copy)."""
    if name in SHARDED:
        digests = shard_digests(text)
        assert len(digests) == world and len(set(digests)) == world, digests
        # (a built-in VAE trained on rank 0 alone logs its own 1-rank line first)
        assert f"parameters identical on {world} rank(s)" not in text
    else:  # (a built-in VAE trained on rank 0 alone may log a 1-rank line before it)
        assert f"parameters identical on {world} rank(s): digest " in text, \
            "all ranks must hold the same weights"


def assert_same_norms(got: dict[int, float], expected: dict[int, float]) -> None:
    assert got, "grad_norm must be logged"
    for step, norm in got.items():
        assert norm == pytest.approx(expected[step], rel=RTOL), (
            f"step {step}: grad norm {norm} vs {expected[step]} in one process "
            f"(ratio {norm / expected[step]:.4f})")


def assert_weights_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                         rtol: float = RTOL, atol: float = ATOL) -> None:
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        value = got[key].float()
        assert torch.allclose(value, tensor.float(), rtol=rtol, atol=atol), (
            key, (value - tensor.float()).abs().max().item())


def assert_compiled_like_eager(run: Run, eager: Run, backend: str, blocks: int,
                               graphs: int) -> None:
    """`run` compiled its blocks once (one compile line), and its 20 losses, gradient
    norms and final weights are `eager`'s within fp32 rounding."""
    assert len(eager.losses) == 20 and len(run.losses) == 20
    for step, (got, expected) in enumerate(zip(run.losses, eager.losses, strict=True), 1):
        assert got == pytest.approx(expected, rel=COMPILE_RTOL), (step, got, expected)
    for step, norm in eager.grad_norms.items():
        assert run.grad_norms[step] == pytest.approx(norm, rel=COMPILE_RTOL), step
    assert_weights_close(run.payload["weights"], eager.payload["weights"], rtol=COMPILE_RTOL,
                         atol=COMPILE_WEIGHT_ATOL)
    reports = re.findall(r"compile: \d+ transformer blocks -> .*", run.text)
    assert len(reports) == 1, reports
    assert reports[0].startswith(
        f"compile: {blocks} transformer blocks -> {graphs} graph(s) ({backend}) in "), reports
    assert "recompile" not in run.text
