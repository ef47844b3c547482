"""Caption fidelity (train/evaluate.py) judged with two oracle "models" whose right answer
is known, instead of a range check on a barely trained one.

The oracles read the caption back from the text tokens evaluate_fidelity hands them and
draw the scene with the dataset's own renderer (data/shapes.py): one draws each row's own
caption and must score about 1; one draws another row's caption and must score low. The
first fails if evaluate_fidelity pairs images with the wrong captions (batches reordered,
dropped or repeated, text rows sliced wrongly, captions scored that are not the ones it
tokenized); the second fails if the score does not come from the model's images at all
(e.g. the held-out reference images scored instead, or a scorer that accepts anything).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from dalle_dist.data.images import pil_to_tensor
from dalle_dist.data.scorer import parse_caption
from dalle_dist.data.shapes import COLOURS, POSITIONS, SHAPES, SIZES, ShapeSpec, render
from dalle_dist.data.tokenizer import ByteTokenizer, Tokenizer
from dalle_dist.model import DiscreteVAE, VAEConfig
from dalle_dist.train.evaluate import FidelityResult, evaluate_fidelity

IMAGE_SIZE = 32  # the scorer's accuracy is >= 0.98 at 32px (tests/data/test_scorer.py)
COUNT, BATCH = 60, 16  # batches of 16, 16, 16 and 12: the last one is partial
#: Every scene a caption can describe, without the jitter the caption does not name.
SCENES = {spec.caption: spec for spec in (
    ShapeSpec(colour, shape, size, position)
    for colour, shape, size, position in itertools.product(COLOURS, SHAPES, SIZES, POSITIONS))}


class DrawingOracle:
    """Stands in for DALLE.generate_images: reads each row's caption off its text tokens and
    draws that scene (shift=0), or the scene of the row `shift` places on (a derangement of
    the batch, so no image is drawn for its own caption unless two captions agree)."""

    def __init__(self, tokenizer: Tokenizer, text_seq_len: int, shift: int = 0) -> None:
        self.tokenizer, self.shift = tokenizer, shift
        self.config = SimpleNamespace(text_seq_len=text_seq_len)
        self.seen: list[str] = []

    def generate_images(self, text: torch.Tensor, vae: DiscreteVAE, filter_thres: float,
                        temperature: float, generator: torch.Generator,
                        cond_scale: float = 1.0) -> torch.Tensor:
        assert cond_scale == 1.0  # evaluate_fidelity's default: no guidance
        captions = [self.tokenizer.decode(row.tolist()) for row in text]
        self.seen += captions
        drawn = captions[self.shift:] + captions[:self.shift]
        size = vae.config.image_size
        return torch.stack([pil_to_tensor(render(SCENES[c], size)) for c in drawn])


@pytest.fixture(scope="module")
def vae() -> DiscreteVAE:
    """Only its image size matters to evaluate_fidelity; the oracles never decode tokens."""
    return DiscreteVAE(VAEConfig(image_size=IMAGE_SIZE, num_tokens=32, codebook_dim=16,
                                 num_layers=2, num_resnet_blocks=0, hidden_dim=16))


def _evaluate(oracle: DrawingOracle, vae: DiscreteVAE) -> FidelityResult:
    return evaluate_fidelity(oracle, vae, oracle.tokenizer, COUNT,  # type: ignore[arg-type]
                             data_seed=0, device=torch.device("cpu"), batch_size=BATCH)


def test_drawing_each_caption_scores_about_1(vae: DiscreteVAE) -> None:
    oracle = DrawingOracle(ByteTokenizer(), text_seq_len=40)
    result = _evaluate(oracle, vae)
    assert result.images.shape == (COUNT, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert oracle.seen == result.captions, "the captions scored are the ones the model got"
    assert len(set(result.captions)) > COUNT // 2, "held-out captions vary"
    assert all(parse_caption(c).colour and parse_caption(c).shape for c in result.captions)
    score = result.score
    assert score >= 0.95, result.line
    assert result.line == f"caption fidelity: {result.score:.3f} over {COUNT} images"


def test_drawing_another_rows_caption_scores_low(vae: DiscreteVAE) -> None:
    oracle = DrawingOracle(ByteTokenizer(), text_seq_len=40, shift=1)
    result = _evaluate(oracle, vae)
    assert oracle.seen == result.captions
    # 6 colours x 3 shapes: a wrong caption's scene matches by chance about 1 time in 18.
    score = result.score
    assert score < 0.3, result.line
