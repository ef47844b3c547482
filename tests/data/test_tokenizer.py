"""Tokenizers keep id 0 for padding, round-trip text, rebuild from a checkpoint dict, and turn
bad files and over-long captions into user errors that name the flag to change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFRaw
from tokenizers import models, pre_tokenizers

from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    check_caption_lengths,
    load_tokenizer,
    normalize_caption,
    tokenize,
    tokenizer_from_dict,
)
from dalle_dist.errors import DataError


def hug(path: Path) -> TokenizerConfig:
    """--hug --bpe_path PATH."""
    return TokenizerConfig(bpe_path=str(path), hug=True)


WORDS = ["[UNK]", "a", "small", "large", "red", "blue", "circle", "square", "on", "the", "left"]


@pytest.fixture
def word_tokenizer_path(tmp_path: Path) -> Path:
    """A tiny WordLevel tokenizers JSON, the kind of file --bpe_path takes."""
    raw = HFRaw(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "words.json"
    raw.save(str(path))
    return path


# -- byte tokenizer ----------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "a small red circle on the left",
    "  A   Large\tBLUE square\n at the top ",
    "Ünïcödé ✓ 画像 — émoji 🙂",
])
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(1 <= i <= 256 for i in ids)
    assert tok.decode(ids) == normalize_caption(text)
    assert tok.decode(ids) == " ".join(text.lower().split())


def test_byte_ids_are_utf8_bytes_plus_one() -> None:
    tok = ByteTokenizer()
    assert tok.vocab_size == 257
    assert tok.encode("Ab é") == [b + 1 for b in "ab é".encode()]
    assert len(tok.encode("é")) == 2  # two UTF-8 bytes
    assert tok.decode([0, *tok.encode("ok"), 0, 0]) == "ok"  # padding is ignored


# -- tokenize ------------------------------------------------------------------------------

def test_tokenize_pads_with_zero() -> None:
    tok = ByteTokenizer()
    out = tokenize(tok, ["ab", "abcd", ""], context_length=6)
    assert out.shape == (3, 6) and out.dtype == torch.long
    assert out.tolist() == [
        [98, 99, 0, 0, 0, 0],
        [98, 99, 100, 101, 0, 0],
        [0, 0, 0, 0, 0, 0],
    ]


def test_too_long_caption_is_a_user_error() -> None:
    tok = ByteTokenizer()
    with pytest.raises(DataError) as info:
        tokenize(tok, ["fits", "this caption is too long"], context_length=8)
    message = str(info.value)
    assert "--truncate_captions" in message
    assert "--text_seq_len" in message
    assert "this caption is too long" in message and "24 tokens" in message


def test_truncate_cuts_caption() -> None:
    tok = ByteTokenizer()
    out = tokenize(tok, ["this caption is too long"], context_length=8, truncate=True)
    assert out.shape == (1, 8)
    assert tok.decode(out[0].tolist()) == "this cap"


def test_check_caption_lengths() -> None:
    tok = ByteTokenizer()
    check_caption_lengths(tok, ["short", "exactly8"], 8, truncate=False)
    with pytest.raises(DataError, match="--truncate_captions"):
        check_caption_lengths(tok, ["short", "exactly 9"], 8, truncate=False)
    check_caption_lengths(tok, ["short", "exactly 9"], 8, truncate=True)


# -- HuggingFace tokenizers JSON -----------------------------------------------------------

def test_hf_ids_shifted_by_one(word_tokenizer_path: Path) -> None:
    tok = load_tokenizer(hug(word_tokenizer_path))
    assert isinstance(tok, HFTokenizer)
    assert tok.vocab_size == len(WORDS) + 1
    ids = tok.encode("a small red circle")
    assert ids == [WORDS.index(w) + 1 for w in ("a", "small", "red", "circle")]
    assert 0 not in ids
    assert tok.encode("a purple circle") == [2, 1, 7]  # unknown word -> [UNK] (0) + 1


def test_hf_decode_round_trip(word_tokenizer_path: Path) -> None:
    tok = load_tokenizer(hug(word_tokenizer_path))
    text = "a large blue square on the left"
    assert tok.decode(tok.encode(text)) == text
    padded = tokenize(tok, [text], context_length=12)
    assert padded[0, 7:].tolist() == [0] * 5
    assert tok.decode(padded[0].tolist()) == text  # padding dropped before decoding


def test_hf_dict_round_trip(word_tokenizer_path: Path) -> None:
    tok = load_tokenizer(hug(word_tokenizer_path))
    values = tok.to_dict()
    assert values["kind"] == "hf"
    json.loads(values["json"])  # plain JSON text, safe in a weights_only checkpoint
    rebuilt = tokenizer_from_dict(values)
    assert isinstance(rebuilt, HFTokenizer)
    text = "a small blue circle on the left"
    assert rebuilt.encode(text) == tok.encode(text)
    assert rebuilt.vocab_size == tok.vocab_size


def test_byte_dict_round_trip() -> None:
    rebuilt = tokenizer_from_dict(ByteTokenizer().to_dict())
    assert isinstance(rebuilt, ByteTokenizer)
    assert rebuilt.encode("Hi") == ByteTokenizer().encode("Hi")
    assert isinstance(load_tokenizer(None), ByteTokenizer)
    assert isinstance(load_tokenizer(TokenizerConfig()), ByteTokenizer)


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError) as info:
        load_tokenizer(hug(missing))
    message = str(info.value)
    assert "--bpe_path" in message and "does not exist" in message and str(missing) in message


@pytest.mark.parametrize("content", [b"this is not json", b'{"valid": "json, wrong schema"}',
                                     b"\xff\xfe\x00binary"])
def test_non_json_tokenizer_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_tokenizer(hug(path))
    message = str(info.value)
    assert "--bpe_path" in message and str(path) in message
    assert "\n" not in message  # the CLI prints it as one line
