"""The built-in shapes dataset is a pure function of (seed, index), in this process and in
any other, and its captions describe exactly the scene that was drawn."""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from dalle_dist.data.shapes import COLOURS, POSITIONS, SHAPES, SIZES, ShapesDataset

CAPTION = re.compile(
    r"^a (small|large) (red|green|blue|yellow|purple|cyan) (circle|square|triangle) "
    r"(on the left|on the right|at the top|at the bottom|in the center)$"
)

#: Hash of the first 20 items; the same code runs in-process and in a fresh interpreter.
HASH_SNIPPET = textwrap.dedent("""
    import hashlib
    from dalle_dist.data.shapes import ShapesDataset
    data = ShapesDataset(count=100, image_size=32, seed=7)
    digest = hashlib.sha256()
    for i in range(20):
        image, caption = data[i]
        digest.update(image.numpy().tobytes())
        digest.update(caption.encode("utf-8"))
    print(digest.hexdigest())
""")


def _hash_in_process() -> str:
    """HASH_SNIPPET run in this interpreter, so both sides run literally the same code."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(HASH_SNIPPET, {})
    return out.getvalue().strip()


def test_same_seed_same_items() -> None:
    a, b = ShapesDataset(50, 32, seed=3), ShapesDataset(50, 32, seed=3)
    for i in (0, 1, 17, 49):
        image_a, caption_a = a[i]
        image_b, caption_b = b[i]
        assert torch.equal(image_a, image_b)
        assert caption_a == caption_b
    # Reading an item twice gives the same item: there is no hidden RNG state.
    assert torch.equal(a[5][0], a[5][0])


def test_different_seed_different_items() -> None:
    a, b = ShapesDataset(50, 32, seed=3), ShapesDataset(50, 32, seed=4)
    images_differ = sum(not torch.equal(a[i][0], b[i][0]) for i in range(10))
    captions_differ = sum(a[i][1] != b[i][1] for i in range(10))
    assert images_differ == 10  # jitter alone makes every image differ
    assert captions_differ >= 5


def test_items_differ_across_indices() -> None:
    data = ShapesDataset(50, 32, seed=0)
    assert len({data[i][1] for i in range(20)}) > 5


@pytest.mark.parametrize("size", [16, 32, 64])
def test_image_size(size: int) -> None:
    data = ShapesDataset(count=5, image_size=size, seed=0)
    image, _ = data[0]
    assert image.shape == (3, size, size)
    assert image.dtype == torch.float32
    assert image.min() >= 0.0 and image.max() <= 1.0
    # A real shape is drawn: some pixels are far from the light grey background.
    assert (image.min(dim=0).values < 0.5).any()
    assert len(data) == 5


def test_same_hash_in_another_process() -> None:
    result = subprocess.run([sys.executable, "-c", HASH_SNIPPET], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    here = _hash_in_process()
    assert re.fullmatch(r"[0-9a-f]{64}", here)
    assert result.stdout.strip() == here


def test_caption_format_matches_spec() -> None:
    data = ShapesDataset(count=200, image_size=16, seed=1)
    for i in range(200):
        spec = data.spec(i)
        _, caption = data[i]
        match = CAPTION.match(caption)
        assert match, caption
        assert match.groups() == (spec.size, spec.colour, spec.shape, spec.position)
        assert caption == spec.caption


def test_every_attribute_appears() -> None:
    data = ShapesDataset(count=2000, image_size=16, seed=0)
    specs = [data.spec(i) for i in range(2000)]
    assert {s.colour for s in specs} == set(COLOURS)
    assert {s.shape for s in specs} == set(SHAPES)
    assert {s.size for s in specs} == set(SIZES)
    assert {s.position for s in specs} == set(POSITIONS)


def test_captions_lists_every_combination() -> None:
    captions = ShapesDataset().captions()
    assert len(captions) == len(set(captions)) == 6 * 3 * 2 * 5
    assert all(CAPTION.match(c) for c in captions)


def test_index_past_the_end_raises_index_error() -> None:
    """A Dataset without __iter__ is iterated through __getitem__ until IndexError, so an
    index past the end must raise it, or `for image, caption in dataset` never ends."""
    data = ShapesDataset(count=3, image_size=16, seed=0)
    seen = sum(1 for _ in itertools.islice(data, 10))  # bounded, so a bug cannot hang
    assert seen == 3, f"iterating a 3-item ShapesDataset yielded {seen}+ items"
    with pytest.raises(IndexError):
        data[3]
