"""Image-text folders in DALLE-pytorch's layout: every format and colour mode comes out as an
RGB tensor of the requested size, bad files are skipped and counted, and a folder with
nothing usable fails before training with one readable line."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from dalle_dist.data import (
    CaptionCollate,
    DataConfig,
    ShapesDataset,
    TextImageFolder,
    build_dataset,
    check_captions,
    describe_dataset,
)
from dalle_dist.data.images import random_resized_crop
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.errors import ConfigError, DataError

SIZE = 24
LINES = ["a red thing", "a crimson object", "something red"]


def _picture(mode: str, size: tuple[int, int], seed: int) -> Image.Image:
    """A random-pixel image in `mode`, so crops and conversions have content to move."""
    g = torch.Generator().manual_seed(seed)
    rgba = torch.randint(0, 256, (size[1], size[0], 4), generator=g, dtype=torch.uint8)
    image = Image.fromarray(rgba.numpy(), "RGBA")
    if mode == "P":
        return image.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE)
    return image.convert(mode)


def _save(path: Path, mode: str, caption: str | None, size: tuple[int, int] = (40, 30),
          seed: int = 0) -> None:
    """Write an image (format from the suffix) and, unless caption is None, its .txt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _picture(mode, size, seed).save(path)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption, encoding="utf-8")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Every format and mode DALLE-pytorch users feed, plus one of each kind of bad file."""
    root = tmp_path / "data"
    text = "\n".join(LINES) + "\n\n"  # a trailing blank line is not a caption
    _save(root / "rgb.png", "RGB", text, seed=1)
    _save(root / "grey.jpg", "L", text, seed=2)
    _save(root / "colour.jpeg", "RGB", text, size=(30, 50), seed=3)
    _save(root / "palette.bmp", "P", text, seed=4)
    _save(root / "alpha.webp", "RGBA", text, seed=5)
    _save(root / "grey_alpha.png", "LA", text, seed=6)
    _save(root / "nested" / "deeper" / "rgba.png", "RGBA", text, size=(64, 64), seed=7)
    _save(root / "UPPER.PNG", "P", text, seed=8)
    # Bad files: random bytes named .png, a caption file with only whitespace, and an
    # image with no caption at all.
    (root / "broken.png").write_bytes(os.urandom(512))
    (root / "broken.txt").write_text("caption of a broken image\n", encoding="utf-8")
    _save(root / "empty_caption.png", "RGB", " \n\t\n", seed=9)
    _save(root / "uncaptioned.png", "RGB", None, seed=10)
    (root / "notes.md").write_text("not an image", encoding="utf-8")
    return root


GOOD = 8  # captioned, readable images in `folder`


def test_every_item_is_rgb_tensor_of_requested_size(folder: Path) -> None:
    for size in (SIZE, 16):
        data = TextImageFolder(folder, size)
        assert len(data) == GOOD
        names = {p.name for p in data.images}
        assert "rgba.png" in names and "UPPER.PNG" in names and "alpha.webp" in names
        for i in range(len(data)):
            image, caption = data[i]
            assert image.shape == (3, size, size), data.images[i]
            assert image.dtype == torch.float32
            assert 0.0 <= image.min() and image.max() <= 1.0
            assert image.std() > 0.05  # real pixels, not a blank conversion
            assert caption in LINES


def test_caption_is_a_random_line(folder: Path) -> None:
    data = TextImageFolder(folder, SIZE)
    assert data.captions[0] == LINES  # blank lines dropped, whitespace stripped
    torch.manual_seed(0)
    picked = [data[0][1] for _ in range(40)]
    assert set(picked) <= set(LINES)
    assert len(set(picked)) > 1
    torch.manual_seed(0)
    assert [data[0][1] for _ in range(40)] == picked  # the global seed decides
    assert sorted(data.all_captions()) == sorted(LINES * GOOD)


def test_bad_files_are_skipped_and_reported(folder: Path) -> None:
    data = TextImageFolder(folder, SIZE)
    report = data.report
    assert [p.name for p in report.unreadable_images] == ["broken.png"]
    assert [p.name for p in report.empty_captions] == ["empty_caption.txt"]
    assert [p.name for p in report.missing_captions] == ["uncaptioned.png"]
    summary = report.summary("image-text pairs")
    assert summary.startswith(f"{GOOD} image-text pairs found")
    assert "skipped 1 unreadable images" in summary
    assert "skipped 1 empty caption files" in summary
    assert "ignored 1 images without a .txt caption" in summary
    assert describe_dataset(data) == summary
    assert all(p.name not in {"broken.png", "empty_caption.png"} for p in data.images)


def test_uncaptioned_images_count_without_require_captions(folder: Path) -> None:
    """VAE training needs no captions: an image with no or an empty .txt is still an image."""
    data = TextImageFolder(folder, SIZE, require_captions=False)
    names = [p.name for p in data.images]
    assert "uncaptioned.png" in names and "empty_caption.png" in names
    assert len(data) == GOOD + 2
    assert not data.report.missing_captions and not data.report.empty_captions
    image, caption = data[names.index("uncaptioned.png")]
    assert image.shape == (3, SIZE, SIZE)
    assert caption == ""


def test_folder_without_usable_pairs(tmp_path: Path) -> None:
    root = tmp_path / "unusable"
    root.mkdir()
    (root / "broken.png").write_bytes(os.urandom(256))
    (root / "broken.txt").write_text("a caption", encoding="utf-8")
    _save(root / "lonely.png", "RGB", None)
    with pytest.raises(DataError) as info:
        TextImageFolder(root, SIZE)
    message = str(info.value)
    assert "\n" not in message
    assert str(root) in message and "--image_text_folder" in message
    assert "skipped 1 unreadable images" in message


def test_empty_folder_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        TextImageFolder(tmp_path, SIZE, require_captions=False, flag="--image_folder")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--image_folder {tmp_path}") and "the folder is empty" in message


def test_index_past_the_end_raises_index_error(folder: Path) -> None:
    """Iteration through __getitem__ stops only at IndexError; wrapping indices around
    (meant for the undecodable-image fallback) makes `for item in dataset` endless."""
    data = TextImageFolder(folder, SIZE)
    seen = sum(1 for _ in itertools.islice(data, GOOD + 5))  # bounded: a bug cannot hang
    assert seen == GOOD, f"iterating {GOOD} images yielded {seen}+ items"
    with pytest.raises(IndexError):
        data[GOOD]


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        TextImageFolder(tmp_path / "nowhere", SIZE)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="is not a folder"):
        TextImageFolder(a_file, SIZE)


def test_bad_resize_ratio(folder: Path) -> None:
    for ratio in (0.0, 1.5):
        with pytest.raises(DataError, match="lower_ratio"):
            TextImageFolder(folder, SIZE, resize_ratio=ratio)


@pytest.mark.parametrize("ratio", [0.3, 0.75, 1.0])
def test_random_resized_crop_size(ratio: float) -> None:
    image = _picture("RGB", (50, 31), seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        assert random_resized_crop(image, 20, ratio, g).size == (20, 20)


def test_random_resized_crop_full_ratio_is_plain_resize() -> None:
    image = _picture("RGB", (40, 40), seed=1)
    expected = image.resize((16, 16), Image.Resampling.BICUBIC)
    for seed in range(3):
        got = random_resized_crop(image, 16, 1.0, torch.Generator().manual_seed(seed))
        assert got.tobytes() == expected.tobytes()


def test_random_resized_crop_uses_generator() -> None:
    image = _picture("RGB", (60, 60), seed=2)

    def crop(seed: int) -> bytes:
        return random_resized_crop(image, 16, 0.3, torch.Generator().manual_seed(seed)).tobytes()

    assert crop(4) == crop(4)
    assert len({crop(s) for s in range(6)}) > 1


def test_caption_collate() -> None:
    data = ShapesDataset(count=4, image_size=16, seed=0)
    batch = [data[i] for i in range(4)]
    collate = CaptionCollate(ByteTokenizer(), text_seq_len=40, truncate=False)
    images, text, captions = collate(batch)
    assert images.shape == (4, 3, 16, 16)
    assert torch.equal(images[2], batch[2][0])
    assert captions == [caption for _, caption in batch]
    assert text is not None and text.shape == (4, 40) and text.dtype == torch.long
    assert ByteTokenizer().decode(text[1].tolist()) == captions[1]

    images, text, captions = CaptionCollate(None, 40, False)(batch)
    assert text is None and images.shape == (4, 3, 16, 16) and len(captions) == 4


def test_build_dataset_shapes_and_folder(folder: Path) -> None:
    shapes = build_dataset(DataConfig(shapes_count=12, shapes_seed=5), 16,
                           require_captions=True)
    assert isinstance(shapes, ShapesDataset)
    assert len(shapes) == 12 and shapes.seed == 5 and shapes[0][0].shape == (3, 16, 16)
    assert describe_dataset(shapes) == "built-in shapes: 12 images of 16x16"

    from_folder = build_dataset(DataConfig(image_text_folder=str(folder)), SIZE,
                                require_captions=False)
    assert isinstance(from_folder, TextImageFolder) and len(from_folder) == GOOD + 2

    with pytest.raises(ConfigError, match="--shapes_count"):
        build_dataset(DataConfig(shapes_count=0), 16, require_captions=True)


def test_negative_shapes_seed_is_a_config_error() -> None:
    """--shapes_seed -1 is a bad flag value: docs/design.md wants a one-line user error before
    training, not numpy's ValueError from the first item the loader reads."""
    with pytest.raises(ConfigError, match="--shapes_seed"):
        dataset = build_dataset(DataConfig(shapes_count=4, shapes_seed=-1), 16,
                                require_captions=True)
        dataset[0]


def test_check_captions_on_shapes() -> None:
    shapes = ShapesDataset(count=10, image_size=16)
    longest = max(len(ByteTokenizer().encode(c)) for c in shapes.captions())
    with pytest.raises(DataError, match="--text_seq_len"):
        check_captions(shapes, ByteTokenizer(), text_seq_len=longest - 1, truncate=False)
    check_captions(shapes, ByteTokenizer(), text_seq_len=longest - 1, truncate=True)
    check_captions(shapes, ByteTokenizer(), text_seq_len=longest, truncate=False)


def test_check_captions_on_folder(folder: Path) -> None:
    data = TextImageFolder(folder, SIZE)
    with pytest.raises(DataError, match="crimson"):
        check_captions(data, ByteTokenizer(), text_seq_len=12, truncate=False)
    check_captions(data, ByteTokenizer(), text_seq_len=16, truncate=False)


def _truncated_jpeg(path: Path, caption: str) -> None:
    """A JPEG cut in half: Image.verify() accepts it, decoding the pixels fails."""
    _save(path, "RGB", caption, seed=11)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_undecodable_image_falls_back_to_next(tmp_path: Path) -> None:
    _save(tmp_path / "a_good.png", "RGB", "the good one", seed=12)
    _truncated_jpeg(tmp_path / "b_truncated.jpg", "the truncated one")
    data = TextImageFolder(tmp_path, SIZE)
    assert len(data) == 2  # the scan cannot tell; loading must cope
    image, caption = data[1]
    assert image.shape == (3, SIZE, SIZE)
    assert caption == "the good one"  # the caption travels with the image actually used


def test_no_decodable_image(tmp_path: Path) -> None:
    _truncated_jpeg(tmp_path / "only.jpg", "a caption")
    data = TextImageFolder(tmp_path, SIZE)
    with pytest.raises(DataError, match="could be decoded"):
        data[0]
