"""The sharded format's files, read in one process: convert's round trip, what is refused
unread, the format flags, and --resume's choice of directory. The runs that write sharded
checkpoints on several ranks are tests/backends/test_sharded_checkpoints.py's.
"""

from __future__ import annotations

import pickle
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dalle_dist.backends.registry import BACKENDS
from dalle_dist.checkpoint.dcp_io import read_whole
from dalle_dist.checkpoint.formats import FULL, NATIVE, SHARDED, resolve_format
from dalle_dist.checkpoint.load import read_any_checkpoint
from dalle_dist.checkpoint.resume import decide_start, newest_checkpoint
from dalle_dist.checkpoint.sharded_dir import (
    META_FILE,
    read_sharded_whole,
    sharded_checkpoint_dir,
    write_sharded,
)
from dalle_dist.checkpoint.tools import convert_checkpoint, inspect_checkpoint
from dalle_dist.errors import CheckpointError, ConfigError
from dalle_dist.train.config import RunPaths
from tests.conftest import TINY_DALLE_FLAGS, TINY_TRAIN_FLAGS, assert_user_error, run_cli


def same(a: object, b: object) -> bool:
    """Equal values, tensors bit for bit, however nested."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_payloads_equal(got: dict, expected: dict) -> None:
    for key in ("kind", "step", "epoch", "configs", "rng", "vae_weights", "scheduler"):
        assert same(got[key], expected[key]), key
    assert got["weights"].keys() == expected["weights"].keys()
    for name, tensor in expected["weights"].items():
        assert torch.equal(got["weights"][name], tensor), name
    assert got["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]
    for name, moments in expected["optimizer"]["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(got["optimizer"]["state"][name][key], tensor), (name, key)


def test_a_file_converts_to_sharded_and_back_unchanged(tiny_dalle: Path, tmp_path: Path) -> None:
    """file -> sharded -> file keeps weights, Adam moments, configs and RNG bit for bit;
    inspect reads the directory's shapes from DCP's metadata alone.
    Caught: the optimizer left out of the DCP save (a converted file resumes Adam fresh)."""
    original = torch.load(tiny_dalle, weights_only=True)
    assert original["optimizer"]["state"], "the fixture trained: Adam has state"
    sharded, back = tmp_path / "dalle-sharded", tmp_path / "back.pt"
    done = convert_checkpoint(tiny_dalle, sharded)
    assert done["to"] == "sharded" and done["optimizer"]
    assert (sharded / "latest").read_text() == f"step-{original['step']:07d}"
    convert_checkpoint(sharded, back)
    assert_payloads_equal(torch.load(back, weights_only=True), original)
    assert_payloads_equal(read_sharded_whole(sharded, "test"), original)

    info = inspect_checkpoint(sharded)
    assert info["format"] == "sharded" and info["optimizer"] is True
    assert info["weights"]["dalle"]["elements"] == sum(
        t.numel() for t in original["weights"].values())
    with pytest.raises(CheckpointError, match="already a single-file dalle checkpoint"):
        convert_checkpoint(tiny_dalle, tmp_path / "x.pt", to="file")


class Boom:
    """Unpickling this would run a command: os.system("touch <marker>")."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return os.system, (f"touch {self.marker}",)


def test_foreign_pickles_in_a_sharded_save_are_refused_unread(tiny_dalle: Path,
                                                              tmp_path: Path) -> None:
    """DCP unpickles `.metadata` and every non-tensor value with plain pickle: here a
    metadata file that runs a command, and a param-group value of a foreign class, are
    refused with one line and run nothing.
    Caught: reading through DCP's own FileSystemReader (the marker file appears)."""
    directory = tmp_path / "d-sharded"
    write_sharded(directory, torch.load(tiny_dalle, weights_only=True))
    save = next(p for p in directory.iterdir() if p.is_dir())
    marker = tmp_path / "ran"
    (save / ".metadata").write_bytes(pickle.dumps(Boom(marker)))
    with pytest.raises(CheckpointError, match="carries pickled Python objects"):
        read_any_checkpoint(directory, "--resume")
    assert not marker.exists()

    other = tmp_path / "o-sharded"
    payload = torch.load(tiny_dalle, weights_only=True)
    payload["optimizer"]["param_groups"][0]["lr"] = Fraction(1, 3)
    write_sharded(other, payload)
    with pytest.raises(CheckpointError, match="carries pickled Python objects"):
        read_any_checkpoint(other, "--resume")


def test_resume_auto_takes_the_newest_of_file_and_sharded_directory(tiny_dalle: Path,
                                                                    tmp_path: Path) -> None:
    """A run that changed format leaves both: the newer one wins; an unfinished save
    folder (no DCP .metadata) is refused by name, and the directory above it is not."""
    paths = RunPaths.for_output(str(tmp_path / "run"))
    payload = torch.load(tiny_dalle, weights_only=True)
    torch.save({**payload, "step": payload["step"] + 1}, paths.checkpoint)
    write_sharded(sharded_checkpoint_dir(paths.checkpoint), payload)

    class Log:
        def info(self, message: str) -> None:
            raise AssertionError(message)

    assert newest_checkpoint(paths, Log()) == paths.checkpoint
    write_sharded(sharded_checkpoint_dir(paths.checkpoint),
                  {**payload, "step": payload["step"] + 2})
    assert newest_checkpoint(paths, Log()) == sharded_checkpoint_dir(paths.checkpoint)

    unfinished = sharded_checkpoint_dir(paths.checkpoint) / "step-0009999"
    unfinished.mkdir()
    (unfinished / META_FILE).write_bytes((unfinished.parent / f"step-{payload['step'] + 2:07d}"
                                          / META_FILE).read_bytes())
    with pytest.raises(CheckpointError, match="a save that never finished"):
        read_any_checkpoint(unfinished, "--resume")
    state = read_whole(unfinished.parent / f"step-{payload['step'] + 2:07d}", {"model"})
    assert state.keys() == {"model"}

    # --resume of one of the output's own kept saves continues it; no --overwrite needed
    kept = sharded_checkpoint_dir(paths.checkpoint) / f"step-{payload['step'] + 2:07d}"
    choice = SimpleNamespace(source=str(kept), flag="--resume", overwrite=False)
    assert decide_start(choice, paths, "--dalle_output_file_name", Log()).source == str(kept)


def test_each_backend_writes_its_format_and_refuses_the_other() -> None:
    """The defaults (sharded for fsdp, DeepSpeed's own directory, a file elsewhere), and
    one ConfigError naming the fix for what a backend cannot write."""
    assert resolve_format(None, BACKENDS["fsdp"]) == SHARDED
    assert resolve_format(None, BACKENDS["torch"]) == FULL
    assert resolve_format("sharded", BACKENDS["single"], asynchronous=True) == SHARDED
    assert resolve_format(None, BACKENDS["deepspeed"]) == NATIVE
    with pytest.raises(ConfigError, match=r"needs a torch\.distributed process group"):
        resolve_format("sharded", BACKENDS["horovod"])
    with pytest.raises(ConfigError, match="keeps its optimizer partitions in its own"):
        resolve_format("full", BACKENDS["deepspeed"])
    with pytest.raises(ConfigError, match="add --checkpoint_format sharded"):
        resolve_format(None, BACKENDS["torch"], asynchronous=True)


def test_async_checkpoint_without_the_sharded_format_stops_before_writing(
        tiny_vae: Path, tmp_path: Path) -> None:
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, *TINY_TRAIN_FLAGS,
                     "--async_checkpoint", "--dalle_output_file_name", "d", cwd=tmp_path)
    assert_user_error(result, "--async_checkpoint writes sharded checkpoints in the background")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
