"""Generated images depend on the caption: the same seed with two captions gives two
different sets of image tokens, and the same seed with the same caption gives the same.

The model is sharp_dalle (tests/conftest.py): tiny_dalle's checkpoint with its transformer
re-drawn at weight std 1. A barely trained or freshly initialised DALL-E (std 0.02) moves
its image logits by about 0.01 when the caption changes, so the same seed draws the same
tokens for every caption and a test could not tell it from a model that never sees its
caption; at std 1 the caption moves them by several units. These tests fail if sampling
never sees the caption (the prefix built from padding or from a fixed caption), if the KV
cache drops the text prefix, if only the start of a caption reaches the model, or if
`generate` samples every prompt from the same text.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dalle_dist.data.tokenizer import tokenize
from dalle_dist.generate import GenerateConfig, Sampler, generate, load_sampler, prompt_dir_name

CAPTIONS = ["a small red circle on the left",
            "a small red circle on the right",  # differs only in the last word
            "a large blue square at the top"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def sampler(sharp_dalle: Path) -> Sampler:
    return load_sampler(sharp_dalle, CPU)


def _tokens(sampler: Sampler, caption: str, seed: int, use_cache: bool) -> torch.Tensor:
    text = tokenize(sampler.tokenizer, [caption], sampler.model.config.text_seq_len)
    return sampler.model.sample_image_tokens(text, filter_thres=0.5, temperature=1.0,
                                             generator=torch.Generator().manual_seed(seed),
                                             use_cache=use_cache)[0]


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_seed_other_caption_other_tokens(sampler: Sampler, seed: int,
                                              use_cache: bool) -> None:
    tokens = {c: _tokens(sampler, c, seed, use_cache) for c in CAPTIONS}
    for caption in CAPTIONS:  # the seed alone decides the noise: a rerun repeats itself
        assert torch.equal(_tokens(sampler, caption, seed, use_cache), tokens[caption])
    for a, b in itertools.combinations(CAPTIONS, 2):
        differ = int((tokens[a] != tokens[b]).sum())
        # 16 tokens with 16 candidates each: captions that matter change several of them.
        assert differ >= 3, (a, b, tokens[a].tolist(), tokens[b].tolist())


def _images(sharp_dalle: Path, prompt: str, out: Path) -> list[np.ndarray]:
    config = GenerateConfig(num_images=3, batch_size=2, top_k=0.5, seed=0)
    generate(str(sharp_dalle), [prompt], str(out), config, CPU, log=lambda _: None)
    folder = out / prompt_dir_name(prompt)
    return [np.asarray(Image.open(folder / f"{i}.png")) for i in range(3)]


def test_generate_draws_each_prompt_for_the_same_seed(sharp_dalle: Path, tmp_path: Path
                                                      ) -> None:
    """`dalle-dist generate --seed 0` for two prompts: different pictures; again for the
    first prompt: the same pictures."""
    first = _images(sharp_dalle, CAPTIONS[0], tmp_path / "a")
    again = _images(sharp_dalle, CAPTIONS[0], tmp_path / "again")
    other = _images(sharp_dalle, CAPTIONS[2], tmp_path / "b")
    repeated = [np.array_equal(x, y) for x, y in zip(first, again, strict=True)]
    assert all(repeated), repeated
    shared = [np.array_equal(x, y) for x, y in zip(first, other, strict=True)]
    assert not any(shared), f"the same picture for two prompts: {shared}"
