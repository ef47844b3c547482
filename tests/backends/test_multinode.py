"""The multi-node launch line (torchrun --nnodes 2 with a c10d rendezvous), two launcher
processes on 127.0.0.1 standing in for two machines."""

from __future__ import annotations

from pathlib import Path

import torch

from tests import launch
from tests.backends.runs import digest_line
from tests.conftest import TINY_DALLE_FLAGS


def test_two_nodes_train_as_one_job(tmp_path: Path, tiny_vae: Path) -> None:
    results = launch.torchrun_nodes(
        "train", "--distributed_backend", "torch", "--vae_path", str(tiny_vae),
        *TINY_DALLE_FLAGS, "--epochs", "1", "--shapes_count", "64", "--batch_size", "16",
        "--fidelity_images", "0", "--dalle_output_file_name", str(tmp_path / "dalle"),
        cwd=tmp_path)
    texts = [launch.output(r) for r in results]
    assert all(r.returncode == 0 for r in results), [t[-2000:] for t in texts]
    digests = [m for m in map(digest_line, texts) if m]
    assert len(digests) == 1, "exactly one node holds rank 0 and logs"
    assert digests[0].group(1) == "2"
    payload = torch.load(tmp_path / "dalle.pt", weights_only=True)
    assert payload["world_size"] == 2 and payload["step"] == 64 // 16
