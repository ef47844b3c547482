"""The token shard format (data/token_shards.py) read back in one process: what a shard
holds, how a data set of shards reads, what is refused. The encodes and the training runs
over shards are tests/backends/test_token_shards.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open

from dalle_dist.data import TextImageFolder
from dalle_dist.data.encode_sources import (
    FolderSource,
    ImageUnreadable,
    WebDatasetSource,
    view_names,
    views,
)
from dalle_dist.data.token_shards import (
    MANIFEST,
    TokenShards,
    read_manifest,
    shard_is_complete,
    shard_meta,
    shard_name,
    token_dtype,
    write_manifest,
    write_shard,
)
from dalle_dist.data.wds import split_key
from dalle_dist.errors import DataError
from tests.data.test_wds import write_shards


def two_shards(folder: Path, num_tokens: int = 300) -> list[torch.Tensor]:
    tokens = [torch.randint(num_tokens, (3, 4)), torch.randint(num_tokens, (2, 4))]
    write_shard(folder / shard_name(0), tokens[0], ["a red circle", "é\nline two", ""],
                ["k0", "k1", "k2"], num_tokens, "id", (0, 3),
                text_ids=[torch.full((1, 4), 7), torch.arange(8).view(2, 4),
                          torch.zeros(1, 4, dtype=torch.long)])
    write_shard(folder / shard_name(1), tokens[1], ["x", "y"], ["k3", "k4"], num_tokens, "id",
                (3, 6), skipped=["k5"])
    write_manifest(folder, {"encode_id": "id", "image_tokenizer": {
        "sha256": "0" * 64, "image_size": 16, "fmap_size": 2, "num_tokens": num_tokens,
        "channels": 3, "kind": "DiscreteVAE"}, "source": {}, "samples": 5,
        "shards": [{"name": shard_name(0), "start": 0, "samples": 3},
                   {"name": shard_name(1), "start": 3, "samples": 2}]})
    return tokens


def test_rows_keys_and_captions_read_back(tmp_path: Path) -> None:
    """Row i of the directory is row i of the source: its tokens (widened back to int64),
    its key and caption; a caption of several lines gives one of them, the held-out view
    always the first. Caught: an off-by-one shard lookup, a lost UTF-8 character."""
    tokens = two_shards(tmp_path)
    data = TokenShards(tmp_path)
    assert len(data) == 5 and data.keys() == ["k0", "k1", "k2", "k3", "k4"]
    for i, expected in enumerate(torch.cat(tokens)):
        got, _ = data[i]
        assert got.dtype == torch.int64 and torch.equal(got, expected)
    assert data[0][1] == "a red circle" and data[2][1] == "" and data[4][1] == "y"
    assert {data[1][1] for _ in range(40)} == {"é", "line two"}
    assert data.all_captions() == ["a red circle", "é", "line two", "", "x", "y"]
    assert torch.equal(data.text_ids(1), torch.arange(8).view(2, 4))  # one row per line
    assert torch.equal(data.text_ids(0), torch.full((1, 4), 7))
    held = data.subset([1, 3], evaluation=True)
    assert held.keys() == ["k1", "k3"] and held[0][1] == "é" and torch.equal(
        held[1][0], tokens[1][0])


def test_a_shard_is_plain_tensors_in_the_smallest_dtype(tmp_path: Path) -> None:
    """No pickle anywhere (safetensors), ids in uint8 / int16 / int32 by codebook size."""
    two_shards(tmp_path)
    with safe_open(str(tmp_path / shard_name(0)), framework="pt") as f:
        assert set(f.keys()) == {"image_tokens", "caption_bytes", "caption_offsets",
                                 "key_bytes", "key_offsets", "text_ids", "text_offsets"}
        assert f.get_tensor("image_tokens").dtype == torch.int16  # 300 tokens
    assert [token_dtype(n) for n in (256, 257, 32768, 32769)] == [
        torch.uint8, torch.int16, torch.int16, torch.int32]
    assert shard_is_complete(tmp_path / shard_name(0), (0, 3), "id")
    assert not shard_is_complete(tmp_path / shard_name(0), (0, 3), "another encode")
    assert not shard_is_complete(tmp_path / shard_name(0), (0, 4), "id")
    assert shard_meta(tmp_path / shard_name(1))["skipped"] == ["k5"]  # 2 rows of 3 samples
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / shard_name(0)).read_bytes()[:100])
    assert not shard_is_complete(tmp_path / "cut.safetensors", (0, 3), "id")


def test_what_is_not_a_whole_set_of_shards_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"has no manifest\.json"):
        read_manifest(tmp_path)
    two_shards(tmp_path)
    (tmp_path / shard_name(1)).unlink()
    with pytest.raises(DataError, match=r"1 shard\(s\) of the manifest are missing"):
        TokenShards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(DataError, match="not a dalle-dist token shards manifest"):
        read_manifest(tmp_path)


def test_webdataset_samples_in_shard_order_with_the_training_keys(tmp_path: Path) -> None:
    """encode's WebDataset source: shards in order, samples in tar order, the orphan
    image without a caption left out and counted, each key the one the held-out split of
    WebDataset training hashes (shard file name / __key__), images centred squares."""
    paths = write_shards(tmp_path, 2, 3)
    source = WebDatasetSource(str(tmp_path), "png,txt", 16, 3)
    assert len(source) == 6 and source.skipped() == ["ignored 2 samples without both members"]
    assert source.keys() == [split_key(paths[s], f"{s:03d}{i:05d}") for s in range(2)
                             for i in range(3)]
    assert [source.caption_lines(i) for i in (0, 5)] == [["sample 0 0"], ["sample 1 2"]]
    picture = source.picture(4)  # 20 x 16, whole
    assert picture.size == (20, 16) and picture.getpixel((0, 0)) == (40, 10, 90)


def test_an_image_that_does_not_decode_is_unreadable_not_replaced(tmp_path: Path) -> None:
    """An image damaged after the folder's scan (which verified it) fails to decode: the
    encode source raises, where training's reader takes the next image, so no key is
    filed with another image's tokens (the encode skips it and names it)."""
    for i in range(2):
        Image.new("RGB", (16, 16), (200, 10 * i, 0)).save(tmp_path / f"{i}.jpg", quality=95)
        (tmp_path / f"{i}.txt").write_text(f"image {i}")
    source = FolderSource(TextImageFolder(tmp_path, 16))
    (tmp_path / "1.jpg").write_bytes((tmp_path / "1.jpg").read_bytes()[:300])
    assert len(source) == 2 and source.picture(0).size == (16, 16)
    with pytest.raises(ImageUnreadable):
        source.picture(1)


def test_views_and_their_keys() -> None:
    """--crops 3 --flip: the centred square first (what an encode without views writes),
    two random crops from the image's generator, each followed by its mirror; keys that
    the split folds back onto the image's. Caught: a crop drawn from the global RNG (two
    encodes differ), or a mirror of the wrong view."""
    picture = Image.new("RGB", (64, 48))
    picture.putdata([(x * 4, y * 5, (x * y) % 256) for y in range(48) for x in range(64)])
    first, again = (views(picture, 16, 3, 3, True, 0.5, torch.Generator().manual_seed(7))
                    for _ in range(2))
    assert len(first) == 6 and all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(first[0], views(picture, 16, 3, 1, False, 0.5,
                                       torch.Generator())[0])
    for plain, mirrored in zip(first[::2], first[1::2], strict=True):
        assert torch.equal(mirrored, plain.flip(-1))
    assert not torch.equal(first[2], first[4])
    assert view_names(3, True) == ["", "0f", "1", "1f", "2", "2f"]
    assert view_names(1, False) == [""] and view_names(2, False) == ["", "1"]


def test_views_keep_their_images_key_whatever_it_holds(tmp_path: Path) -> None:
    """A row stores its image's key and its view's name apart: the split hashes the key
    as the image run's does, even a file name with '#' in it."""
    write_shard(tmp_path / shard_name(0), torch.zeros(4, 4, dtype=torch.long), ["c"] * 4,
                ["a#b", "a#b", "x", "x"], 32, "id", (0, 2), views=["", "0f", "", "0f"])
    write_manifest(tmp_path, {"encode_id": "id", "image_tokenizer": {}, "source": {},
                              "samples": 4, "shards": [{"name": shard_name(0), "start": 0,
                                                        "samples": 4}]})
    data = TokenShards(tmp_path)
    assert data.keys() == ["a#b", "a#b", "x", "x"]
    assert data.sample_keys() == ["a#b", "a#b#0f", "x", "x#0f"]
