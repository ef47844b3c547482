"""Files that exist on one node only: every rank must still take the same path.

Each rank runs in a folder of its own, as if each were on a machine of its own, and the
command names relative paths. Before the fix, rank 0 resumed a checkpoint that rank 1
did not have (rank 1 started fresh), and ranks that listed different data took different
numbers of steps: both ended in a collective that never met. Now the root decides, every
rank checks what it must read, and all stop together with one line.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from tests import launch
from tests.backends.test_errors import assert_every_rank
from tests.conftest import TINY_DALLE_FLAGS, run_cli


def pairs(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        Image.new("RGB", (16, 16), (40 * i % 255, 90, 200)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a picture number {i}\n")


def train_args(vae: Path, *extra: str) -> list[str]:
    return ["train", "--vae_path", str(vae), *TINY_DALLE_FLAGS, "--epochs", "1",
            "--batch_size", "2", "--fidelity_images", "0", "--distributed_backend", "torch",
            "--dalle_output_file_name", "d", *extra]


def test_ranks_that_see_different_data_stop_together(tmp_path: Path, tiny_vae: Path) -> None:
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    pairs(nodes[0] / "pairs", 8)
    pairs(nodes[1] / "pairs", 4)
    results = launch.bare_ranks(*train_args(tiny_vae, "--image_text_folder", "pairs"),
                                cwd=nodes)
    assert_every_rank(results, "the ranks see different data: steps per epoch rank 0 4, "
                               "rank 1 2", "every rank must read the same --image_text_folder")
    assert not (nodes[0] / "d.pt").exists()


def test_a_checkpoint_on_the_root_node_only(tmp_path: Path, tiny_vae: Path) -> None:
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    first = run_cli(*train_args(tiny_vae, "--distributed_backend", "single", "--shapes_count",
                                "8"), cwd=nodes[0])
    assert first.returncode == 0, first.stderr
    before = (nodes[0] / "d.pt").read_bytes()

    results = launch.bare_ranks(*train_args(tiny_vae, "--resume", "auto", "--shapes_count", "8"),
                                cwd=nodes)
    assert_every_rank(results, "rank 1: --resume d.pt does not exist")
    assert (nodes[0] / "d.pt").read_bytes() == before
    assert not (nodes[1] / "d.pt").exists()
