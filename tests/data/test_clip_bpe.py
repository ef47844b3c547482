"""`--bpe_path bpe_simple_vocab_16e6.txt`: DALLE-pytorch's default tokenizer (CLIP's BPE)
gives DALLE-pytorch 1.6.6's own ids, so a model imported from it reads captions as it
was trained to.

Bugs it fails on: the vocabulary's bytes listed in byte order instead of CLIP's (every
id shifts), the word-end marker left out of the merges, HTML entities kept, lower-casing
skipped, the merges file's gzip form not recognised.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from dalle_dist.checkpoint.dalle_pytorch import installed_clip_merges
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.data.tokenizer import load_tokenizer, same_tokenizer, tokenizer_from_dict
from tests.checkpoint.dalle_pytorch_reference import simple_tokenizer

CAPTIONS = [
    "A Photo of  two   dogs! Running & playing",
    "it's the cat's 3rd birthday, isn't it?",
    "naïve café — déjà vu 😀",
    "&amp;lt;b&amp;gt;bold&amp;lt;/b&amp;gt; 1234567 x²",
    "",
    "  leading and trailing spaces  ",
    "ÄÖÜ ß 東京 タワー",
    "hello-world_foo.bar/baz (1999) [draft] {x} #tag @user",
    "an armchair in the shape of an avocado. an armchair imitating an avocado.",
    "TEXT IN CAPITALS\twith\ttabs\nand a newline",
]


@pytest.fixture(scope="module")
def merges() -> Path:
    path = installed_clip_merges()
    assert path is not None, "make test installs dalle-pytorch 1.6.6, which ships the file"
    return path


def test_ids_are_dalle_pytorchs(merges: Path) -> None:
    theirs = simple_tokenizer()
    ours = load_tokenizer(TokenizerConfig(bpe_path=str(merges)))
    assert ours.vocab_size == theirs.vocab_size == 49408
    shapes = [ShapesDataset(8, 16)[i][1] for i in range(8)]  # the built-in captions too
    for caption in [*CAPTIONS, *shapes]:
        assert ours.encode(caption) == theirs.encode(caption), caption
        ids = theirs.encode(caption)
        assert ours.decode(ids) == theirs.decode(ids).strip(), caption


def test_gzipped_file_and_checkpoint_dict_give_the_same_tokenizer(merges: Path,
                                                                  tmp_path: Path) -> None:
    packed = tmp_path / "bpe_simple_vocab_16e6.txt.gz"
    packed.write_bytes(gzip.compress(merges.read_bytes()))
    plain = load_tokenizer(TokenizerConfig(bpe_path=str(merges)))
    zipped = load_tokenizer(TokenizerConfig(bpe_path=str(packed)))
    assert same_tokenizer(plain.to_dict(), zipped.to_dict())
    rebuilt = tokenizer_from_dict(plain.to_dict())
    for caption in CAPTIONS:
        assert rebuilt.encode(caption) == zipped.encode(caption) == plain.encode(caption)
