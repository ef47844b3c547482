"""Host memory at resume: a checkpoint is mapped, not read, and never written through the map.

Every rank of a node loads the whole single file (weights and Adam state); mapped, they
share one copy in the page cache instead of holding one each (docs/checkpoints.md, "Host
memory at resume"). One real resume, in this process, through the CLI: `train --resume
FILE` continues tiny_dalle's checkpoint for another epoch on the single backend, where the
optimizer keeps the CPU tensors it is given and Adam steps them in place. The process asks
torch for shared maps (torch.serialization.set_default_mmap_options(MAP_SHARED)), under
which such a step would write into the file unless the reader maps it privately.
"""

from __future__ import annotations

import hashlib
import mmap
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TINY_DALLE_FLAGS


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def resumed(tiny_dalle: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, str, list[tuple[Path, Any]]]:
    """(source file, its digest before the resume, (path, mmap) of every torch.load)."""
    from dalle_dist.cli import main

    folder = tmp_path_factory.mktemp("host_memory")
    source = folder / "source.pt"
    shutil.copyfile(tiny_dalle, source)
    before = digest(source)
    loads: list[tuple[Path, Any]] = []
    real_load = torch.load

    def spy(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | Path):
            loads.append((Path(f), kwargs.get("mmap")))
        return real_load(f, *args, **kwargs)

    previous = torch.serialization.get_default_mmap_options()
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(torch, "load", spy)
    torch.serialization.set_default_mmap_options(mmap.MAP_SHARED)
    try:
        status = main(["train", "--resume", str(source), *TINY_DALLE_FLAGS, "--epochs", "2",
                       "--batch_size", "16", "--shapes_count", "64", "--fidelity_images", "0",
                       "--dalle_output_file_name", str(folder / "dalle")])
    finally:
        torch.serialization.set_default_mmap_options(previous)
        monkeypatch.undo()
    assert status == 0
    assert real_load(folder / "dalle.pt", weights_only=True)["step"] > real_load(
        source, weights_only=True)["step"], "the resumed run trained further"
    return source, before, loads


def test_resume_maps_the_checkpoint_instead_of_reading_it(
        resumed: tuple[Path, str, list[tuple[Path, Any]]]) -> None:
    source, _, loads = resumed
    reads = [flag for path, flag in loads if path == source]
    assert reads, f"the resume never loaded {source}: {loads}"
    assert all(flag is True for flag in reads), reads


def test_training_on_from_a_mapped_checkpoint_leaves_its_file_unchanged(
        resumed: tuple[Path, str, list[tuple[Path, Any]]]) -> None:
    source, before, _ = resumed
    assert digest(source) == before
