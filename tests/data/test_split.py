"""The held-out split (--val_fraction): decided by each sample's key alone, so it is the
same for any rank count, after a resume and in any listing order; disjoint from training;
near the fraction; and refused where it leaves either part empty."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from PIL import Image

from dalle_dist.data import CaptionCollate, DataConfig, make_loader
from dalle_dist.data.split import split_indices
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.data.wds import WebDatasetLoader
from dalle_dist.errors import ConfigError
from tests.data.test_wds import write_shards

COLLATE = CaptionCollate(ByteTokenizer(), 24, False)


def _split_keys(keys: list[str], fraction: float) -> tuple[set[str], set[str]]:
    train, val = split_indices(keys, fraction)
    return {keys[i] for i in train}, {keys[i] for i in val}


def test_split_depends_on_keys_only_and_is_near_the_fraction() -> None:
    """Any listing order gives the same parts (a shuffled list: other ranks, a resumed
    run's rescan); the held-out share is within 3 standard errors of F.
    Bug seen failing: held out by position (index % round(1/F) == 0)."""
    keys = [f"photos/{i:05d}" for i in range(4000)]
    train, val = _split_keys(keys, 0.1)
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    assert _split_keys(shuffled, 0.1) == (train, val)
    assert not train & val and train | val == set(keys)
    assert abs(len(val) / len(keys) - 0.1) < 3 * (0.1 * 0.9 / 4000) ** 0.5
    # a larger fraction holds out a superset: raising F never moves a sample back
    assert val <= _split_keys(keys, 0.3)[1]


def _folder(root: Path, count: int) -> Path:
    for i in range(count):
        sub = root / f"part{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 18), (i * 7 % 255, 90, 30)).save(sub / f"img{i}.png")
        (sub / f"img{i}.txt").write_text(f"caption {i}\nother line {i}\n")
    return root


def _folder_parts(root: Path, rank: int, world: int, seed: int, fraction: float
                  ) -> tuple[list[str], list[str]]:
    """(this rank's training keys, the captions of the held-out samples its validation
    batches count: "caption i" names image i)."""
    loader, _ = make_loader(DataConfig(image_text_folder=str(root)), 16, 2, rank, world, seed,
                            COLLATE, True, val_fraction=fraction)
    held = [c for (_, _, caps), n in loader.held_out.batches() for c in caps[:n]]
    return loader.dataset.keys(), held


def test_folder_split_is_the_same_on_1_and_2_ranks_and_after_resume(tmp_path: Path) -> None:
    """The training part is the same list on every rank and for another seed (a resumed
    run rebuilds its loader), the ranks' held-out shares together are the 1-rank held-out
    part, each sample once, none of them trained on. Held-out reads are fixed (first
    caption line, centred crop). Bugs seen failing: the held-out part dealt out with
    DistributedSampler (which pads with repeats: a sample counted twice); keys taken from
    the absolute path (then a copy of the folder elsewhere splits differently)."""
    root = _folder(tmp_path / "data", 25)  # 7 held out: ranks get 4 and 3
    train1, held1 = _folder_parts(root, 0, 1, seed=0, fraction=0.3)
    held_keys = {f"part{int(c.split()[1]) % 3}/img{c.split()[1]}" for c in held1}
    assert train1 and held1 and not set(train1) & held_keys
    assert len(train1) + len(held1) == 25 and len(held_keys) == len(held1)
    shares = [_folder_parts(root, r, 2, seed=5, fraction=0.3) for r in range(2)]
    assert all(train == train1 for train, _ in shares)
    together = shares[0][1] + shares[1][1]
    assert sorted(together) == sorted(held1) and len(set(together)) == len(together)
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    (root).rename(copy / "data")
    assert _folder_parts(copy / "data", 0, 1, seed=9, fraction=0.3) == (train1, held1)

    loader, _ = make_loader(DataConfig(image_text_folder=str(copy / "data")), 16, 2, 0, 1, 0,
                            COLLATE, True, val_fraction=0.3)
    first = [b for b, _ in loader.held_out.batches()]
    again = [b for b, _ in loader.held_out.batches()]
    assert all(c.startswith("caption ") for b in first for c in b[2])
    assert all((a[0] == b[0]).all() and a[2] == b[2] for a, b in zip(first, again, strict=True))


def test_webdataset_split_is_the_same_on_1_and_2_ranks(tmp_path: Path) -> None:
    """Every sample is held out or trained on, never both, whatever the rank count; the
    held-out batches of each rank are padded to one count with batches weighing 0.
    Captions name their sample. Bug seen failing: the training pipeline not filtering
    held-out samples (they were trained on too)."""
    write_shards(tmp_path, 4, 9)
    fraction = 0.3
    one = WebDatasetLoader(str(tmp_path), "png,txt", 16, 1.0, 2, 0, 1, 0, 0, COLLATE, True,
                           val_fraction=fraction)

    def parts(source: WebDatasetLoader) -> tuple[set[str], list[str], int]:
        trained = {c for _, _, caps in source.epoch(0) for c in caps}
        weighted = list(source.held_out.batches())
        held = [c for (_, _, caps), n in weighted for c in caps[:n] if n]
        return trained, held, len(weighted)

    trained1, held1, _ = parts(one)
    assert held1 and not trained1 & set(held1)
    ranks = [parts(WebDatasetLoader(str(tmp_path), "png,txt", 16, 1.0, 2, r, 2, 0, 0, COLLATE,
                                    True, val_fraction=fraction)) for r in range(2)]
    assert sorted(ranks[0][1] + ranks[1][1]) == sorted(held1)
    assert ranks[0][2] == ranks[1][2], "every rank takes as many validation batches"
    assert not (ranks[0][0] | ranks[1][0]) & set(held1)
    assert abs(len(held1) / 36 - fraction) < 0.25


@pytest.mark.parametrize(("fraction", "message"), [
    (1.0, "must be in [0, 1)"), (-0.1, "must be in [0, 1)"),
    (0.0001, "holds out none"), (0.9999, "leaves no training data")])
def test_fractions_that_leave_a_part_empty_are_refused(tmp_path: Path, fraction: float,
                                                       message: str) -> None:
    root = _folder(tmp_path, 6)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        make_loader(DataConfig(image_text_folder=str(root)), 16, 2, 0, 1, 0, COLLATE, True,
                    val_fraction=fraction)
