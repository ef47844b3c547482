"""The shapes scorer reads colour and shape off real dataset images reliably enough to judge
generated ones (>= 0.98, as the issue requires), and tells right captions from wrong ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dalle_dist.data.images import tensor_to_pil
from dalle_dist.data.scorer import Verdict, fidelity, parse_caption, predict
from dalle_dist.data.shapes import BACKGROUND, ShapesDataset

REQUIRED_ACCURACY = 0.98


def _items(count: int, size: int, seed: int = 0) -> tuple[list[torch.Tensor], list[str]]:
    """The first `count` shapes images and captions."""
    data = ShapesDataset(count, size, seed)
    pairs = [data[i] for i in range(count)]
    return [image for image, _ in pairs], [caption for _, caption in pairs]


@pytest.fixture(scope="module")
def shapes_32() -> tuple[list[torch.Tensor], list[str]]:
    """1000 images at 32px, shared by the tests that score them (about a second to score)."""
    return _items(1000, 32)


def _accuracy_message(accuracy: float, count: int, size: int) -> str:
    """What a failing accuracy check prints: the number, the set, the bar."""
    return (f"scorer accuracy {accuracy:.4f} on {count} shapes images at {size}px, "
            f"required >= {REQUIRED_ACCURACY}")


def test_accuracy_at_32px(shapes_32: tuple[list[torch.Tensor], list[str]]) -> None:
    images, captions = shapes_32
    accuracy = fidelity(images, captions)
    assert accuracy >= REQUIRED_ACCURACY, _accuracy_message(accuracy, len(images), 32)


def test_accuracy_at_64px() -> None:
    images, captions = _items(300, 64, seed=1)
    accuracy = fidelity(images, captions)
    assert accuracy >= REQUIRED_ACCURACY, _accuracy_message(accuracy, len(images), 64)


def test_fidelity_counts_per_image_matches(
        shapes_32: tuple[list[torch.Tensor], list[str]]) -> None:
    """fidelity is the fraction of images whose predict() equals parse_caption()."""
    images, captions = shapes_32[0][:50], shapes_32[1][:50]
    hits = sum(predict(im) == parse_caption(c) for im, c in zip(images, captions, strict=True))
    assert fidelity(images, captions) == hits / 50
    # A stacked [b, 3, H, W] batch scores the same as a list of images.
    assert fidelity(torch.stack(images), captions) == hits / 50


def test_wrong_captions_score_low(shapes_32: tuple[list[torch.Tensor], list[str]]) -> None:
    images, captions = shapes_32
    # Each image gets its neighbour's caption: independent scenes, so a match is chance
    # (1 in 18 colour-shape pairs).
    wrong = captions[1:] + captions[:1]
    wrong_score = fidelity(images, wrong)
    assert wrong_score < 0.3, f"fidelity against wrong captions is {wrong_score:.3f}"
    # The same images against their own captions: test_accuracy_at_32px (>= 0.98).


def test_parse_caption() -> None:
    assert parse_caption("a small red circle on the left") == Verdict("red", "circle")
    assert parse_caption("A LARGE Cyan Triangle at the top") == Verdict("cyan", "triangle")
    assert parse_caption("a blue thing") == Verdict("blue", None)
    assert parse_caption("a square") == Verdict(None, "square")
    assert parse_caption("") == Verdict(None, None)


@pytest.mark.parametrize("fill", [BACKGROUND, (255, 255, 255), (10, 10, 10)])
def test_blank_image_has_no_verdict(fill: tuple[int, int, int]) -> None:
    blank = torch.tensor(fill, dtype=torch.float32).view(3, 1, 1).expand(3, 32, 32) / 255
    assert predict(blank) == Verdict(None, None)
    assert fidelity([blank], ["a small red circle in the center"]) == 0.0


def test_length_mismatch_raises() -> None:
    images, captions = _items(3, 16)
    with pytest.raises(ValueError, match="3 images but 2 captions"):
        fidelity(images, captions[:2])
    assert fidelity([], []) == 0.0


def test_pil_and_numpy_inputs_give_same_verdicts() -> None:
    images, captions = _items(40, 32, seed=2)
    pil_images: list[Image.Image] = []
    for image in images:
        from_tensor = predict(image)
        pil = tensor_to_pil(image)
        array = np.asarray(pil)
        assert array.dtype == np.uint8 and array.shape == (32, 32, 3)
        assert predict(pil) == from_tensor
        assert predict(array) == from_tensor
        # A PIL image in another mode is converted, not misread.
        assert predict(pil.convert("RGBA")) == from_tensor
        pil_images.append(pil)
    assert fidelity(pil_images, captions) == fidelity(images, captions)
    assert fidelity(pil_images, captions) >= 0.9
