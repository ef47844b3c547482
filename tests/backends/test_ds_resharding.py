"""DeepSpeed checkpoints at another world size, and on another backend, with Adam's state
(docs/checkpoints.md, "The DeepSpeed directory"):

- ZeRO-2 and ZeRO-3 directories of 2 ranks resumed by one rank, through DeepSpeed's
  universal checkpoint (made once beside the tag);
- a ZeRO directory converted to one file, optimizer included, resumed by fsdp.

The saved runs are the `trained` fixture's DeepSpeed fp32 runs (2 ranks, 5 steps, shared
with the equivalence tests); each test copies the directory it resumes, since the
conversion writes beside the tag. "Equal" is bit for bit: nothing is recomputed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import launch
from tests.backends.runs import BATCH, COMMON, Run
from tests.conftest import run_cli, saved_checkpoint


def converted(source: Path, out: Path) -> dict[str, Any]:
    """`dalle-dist checkpoint convert SOURCE OUT` (a process of its own: DeepSpeed's
    converter imports DeepSpeed), read back."""
    result = run_cli("checkpoint", "convert", str(source), str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with optimizer state" in result.stdout
    return torch.load(out, weights_only=True)


def plain(value: Any) -> Any:
    """Tuples as lists, however nested."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return [plain(v) for v in value] if isinstance(value, list | tuple) else value


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Weights, the EMA (the tag's ema/ shards) and Adam's state of two single-file
    payloads, bit for bit."""
    assert got["weights"].keys() == expected["weights"].keys()
    for name, tensor in expected["weights"].items():
        assert torch.equal(got["weights"][name], tensor), name
    assert got["ema_weights"].keys() == expected["ema_weights"].keys()
    for name, tensor in expected["ema_weights"].items():
        assert torch.equal(got["ema_weights"][name], tensor), name
    # (a sharded save stores betas as a list: DCP flattens tuples)
    assert plain(got["optimizer"]["param_groups"]) == plain(expected["optimizer"]["param_groups"])
    for name, moments in expected["optimizer"]["state"].items():
        assert moments.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        for key, tensor in moments.items():
            assert torch.equal(got["optimizer"]["state"][name][key], tensor), (name, key)


def assert_adams(optimizer: dict[str, Any], single: dict[str, Any]) -> None:
    """The moments read out of DeepSpeed's partitions are Adam's: those of the one-process
    run of the same 5 batches, within what 2 ranks' fp32 sums move (exp_avg_sq is a square:
    twice the gradients' relative error). Caught: the two moments swapped, or a ZeRO-3
    moment reshaped in the wrong order."""
    assert optimizer["state"].keys() == single["state"].keys()
    for name, moments in single["state"].items():
        assert float(optimizer["state"][name]["step"]) == float(moments["step"]) == 5
        for key in ("exp_avg", "exp_avg_sq"):
            got, expected = optimizer["state"][name][key], moments[key]
            assert torch.allclose(got, expected, rtol=1e-3, atol=1e-9), (
                name, key, (got - expected).abs().max().item())


def resume_on_one_rank(run: Run, stage: int, folder: Path) -> str:
    source = folder / "two-ds-cp"
    shutil.copytree(run.folder / "dalle-ds-cp", source)
    result = launch.deepspeed("train", "--deepspeed", "--zero_stage", str(stage), "--resume",
                              str(source), *COMMON, "--batch_size", str(BATCH),
                              "--dalle_output_file_name", "one", nproc=1, cwd=folder)
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    return text


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_partitions_of_two_ranks_resume_on_one(stage: int, trained: Callable[..., Run],
                                                    tmp_path: Path) -> None:
    """The resumed rank's save before its first step (the run has no step left) holds what
    it loaded: the 2 ranks' weights and Adam moments, bit for bit, both gathered the same
    way. Caught: DeepSpeed's universal setting left off (DeepSpeed refuses the world size)."""
    run = trained(f"deepspeed-zero{stage}", "fp32")
    text = resume_on_one_rank(run, stage, tmp_path)
    assert (f"holds ZeRO-{stage} partitions of 2 ranks, this run has 1: loading them through "
            "DeepSpeed's universal checkpoint") in text
    assert "optimizer starts fresh" not in text
    expected = converted(tmp_path / "two-ds-cp", tmp_path / "two-converted.pt")
    assert_same(converted(tmp_path / "one-ds-cp", tmp_path / "one-converted.pt"), expected)
    assert_adams(expected["optimizer"], trained("single", "fp32").payload["optimizer"])


def test_a_converted_zero_directory_resumes_on_fsdp(trained: Callable[..., Run],
                                                    tmp_path: Path) -> None:
    """deepspeed -> fsdp: the converted file's weights and Adam state are what 2 fsdp ranks
    load and save again (their save before the first step), bit for bit."""
    run = trained("deepspeed-zero3", "fp32")
    shutil.copytree(run.folder / "dalle-ds-cp", tmp_path / "ds-cp")
    expected = converted(tmp_path / "ds-cp", tmp_path / "converted.pt")
    result = launch.torchrun("train", "--distributed_backend", "fsdp", "--resume",
                             "converted.pt", *COMMON, "--batch_size", str(BATCH),
                             "--dalle_output_file_name", "fsdp", cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    assert "optimizer starts fresh" not in text
    assert_same(saved_checkpoint(tmp_path / "fsdp.pt"), expected)
