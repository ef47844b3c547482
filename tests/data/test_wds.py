"""WebDataset shards: indexing, the split by rank and by worker, and a 2-rank run."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from dalle_dist.data import CaptionCollate
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.data.wds import (
    WebDatasetLoader,
    index_shard,
    shard_paths,
    skipped_per_worker,
)
from dalle_dist.errors import DataError
from tests import launch
from tests.conftest import TINY_DALLE_FLAGS


def write_shards(root: Path, shards: int, per_shard: int, size: int = 16) -> list[Path]:
    """Shards whose captions name their sample uniquely ("sample 3 7" = shard 3, item 7)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = root / f"shard-{s:03d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                png = io.BytesIO()
                Image.new("RGB", (size + 4, size), (40 * s % 255, 10 * i % 255, 90)).save(
                    png, "PNG")
                for ext, data in (("png", png.getvalue()), ("txt", f"sample {s} {i}".encode())):
                    info = tarfile.TarInfo(f"{s:03d}{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            orphan = tarfile.TarInfo(f"{s:03d}99999.png")  # an image without caption
            orphan.size = 0
            tar.addfile(orphan, io.BytesIO(b""))
        paths.append(path)
    return paths


def loader(root: Path | str, rank: int, world: int, workers: int = 0, batch: int = 4
           ) -> WebDatasetLoader:
    return WebDatasetLoader(str(root), "png,txt", 16, 1.0, batch, rank, world, seed=0,
                            num_workers=workers, collate=CaptionCollate(ByteTokenizer(), 24, False),
                            require_caption=True)


def captions_of(source: WebDatasetLoader, epoch: int = 0) -> list[str]:
    return [c for _, _, captions in source.epoch(epoch) for c in captions]


def test_index_counts_complete_samples_and_reads_captions(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path, 1, 5)
    index = index_shard(path, "png", "txt")
    assert index.samples == 5, "the caption-less image is not a sample"
    assert sorted(index.captions) == [f"sample 0 {i}" for i in range(5)]
    assert index_shard(path, "png", None).samples == 6


def test_folder_and_brace_pattern(tmp_path: Path) -> None:
    write_shards(tmp_path, 3, 2)
    assert [p.name for p in shard_paths(str(tmp_path))] == [f"shard-00{i}.tar" for i in range(3)]
    assert len(shard_paths(str(tmp_path / "shard-{000..002}.tar"))) == 3
    with pytest.raises(DataError, match=r"shard-003\.tar does not exist"):
        shard_paths(str(tmp_path / "shard-{000..003}.tar"))


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_split_the_shards_and_take_equal_steps(tmp_path: Path, workers: int) -> None:
    write_shards(tmp_path, 5, 9)  # ranks get 3 and 2 shards: 27 and 18 samples
    seen = []
    for rank in (0, 1):
        source = loader(tmp_path, rank, 2, workers)
        captions = captions_of(source)
        assert len(captions) == len(source) * 4, "every rank yields exactly len() batches"
        assert len(set(captions)) == len(captions)
        shards = {int(c.split()[1]) for c in captions}
        assert shards <= ({0, 2, 4} if rank == 0 else {1, 3})
        seen.append(set(captions))
    assert not seen[0] & seen[1]
    assert len(loader(tmp_path, 0, 2, workers)) == len(loader(tmp_path, 1, 2, workers))


def test_shuffle_differs_by_epoch_and_repeats_by_seed(tmp_path: Path) -> None:
    write_shards(tmp_path, 2, 8)
    source = loader(tmp_path, 0, 1)
    first, again, second = captions_of(source, 0), captions_of(source, 0), captions_of(source, 1)
    assert first == again and first != second and sorted(first) != []


def test_too_few_shards_or_samples(tmp_path: Path) -> None:
    write_shards(tmp_path, 1, 8)
    with pytest.raises(DataError, match=r"1 WebDataset shards cannot be split over 2 ranks"):
        loader(tmp_path, 0, 2)
    with pytest.raises(DataError, match="fewer than a batch of 16"):
        loader(tmp_path, 0, 1, batch=16)
    with pytest.raises(DataError, match="must name the image and caption keys"):
        WebDatasetLoader(str(tmp_path), "png", 16, 1.0, 4, 0, 1, 0, 0, lambda b: b, True)


def test_items_are_cropped_images_and_token_batches(tmp_path: Path) -> None:
    write_shards(tmp_path, 1, 8)
    images, text, captions = next(iter(loader(tmp_path, 0, 1).epoch(0)))
    assert images.shape == (4, 3, 16, 16) and 0 <= images.min() and images.max() <= 1
    assert text.shape == (4, 24) and text.dtype == torch.long
    assert all(c.startswith("sample 0 ") for c in captions)


def test_two_ranks_train_on_shards(tmp_path: Path, tiny_vae: Path) -> None:
    write_shards(tmp_path / "shards", 4, 12)
    result = launch.torchrun("train", "--distributed_backend", "torch", "--image_text_folder",
                             str(tmp_path / "shards" / "shard-{000..003}.tar"), "--wds",
                             "png,txt", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                             "--epochs", "1", "--batch_size", "8",
                             "--dalle_output_file_name", str(tmp_path / "dalle"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    assert "webdataset: 48 samples in 4 shards, 6 steps per epoch per rank" in text
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == 6


def test_undecodable_images_do_not_leave_a_rank_short(tmp_path: Path) -> None:
    """A sample that fails to decode is skipped; the epoch is topped up to len() batches,
    because a rank with fewer steps would leave the others waiting forever."""
    (path,) = write_shards(tmp_path, 1, 8)
    with tarfile.open(path, "a") as tar:
        for ext, data in (("png", b"not a png"), ("txt", b"broken sample")):
            info = tarfile.TarInfo(f"broken.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    source = loader(tmp_path, 0, 1, batch=3)
    assert len(source) == 3, "indexing counts 9 complete samples"
    captions = captions_of(source)
    assert len(captions) == 9 and "broken sample" not in captions


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_drops_its_first_batches_undecoded(tmp_path: Path,
                                                           workers: int) -> None:
    """epoch(e, start=k) yields batches k.. of the uninterrupted epoch, the same samples
    in the same order, with loader workers too (the DataLoader takes their batches in
    turn; 3 shards give worker 0 two of them), and decodes none of the k x batch skipped
    samples. Caught: skipping whole batches per worker in the wrong proportion, or
    skipping after decoding (a resume at a late position decodes the whole prefix)."""
    write_shards(tmp_path, 3, 9)
    whole = [captions for _, _, captions in loader(tmp_path, 0, 1, workers).epoch(0)]
    assert len(whole) == 6
    for start in (1, 4):
        source = loader(tmp_path, 0, 1, workers)
        decoded = tmp_path / f"decoded-{start}"
        convert = source.convert

        def counted(sample: dict, convert=convert, decoded=decoded) -> tuple:
            with open(decoded, "a") as f:  # loader workers are other processes
                f.write("x")
            return convert(sample)

        source.convert = counted
        resumed = [captions for _, _, captions in source.epoch(0, start=start)]
        assert resumed == whole[start:], start
        # at most the samples after the skipped ones (27 in all) pass the decode
        assert (6 - start) * 4 <= decoded.read_text().count("x") <= 27 - 4 * start


def test_skipped_batches_follow_the_loaders_turns() -> None:
    assert skipped_per_worker(5, [2, 2, 2]) == ([2, 2, 1], 2)
    assert skipped_per_worker(3, [1, 3]) == ([1, 2], 0)  # worker 0 ran out after one
    assert skipped_per_worker(0, [2, 1]) == ([0, 0], 0)
