"""Tokenizers keep id 0 for padding, round-trip text, rebuild from a checkpoint dict, and turn
bad files and over-long captions into user errors that name the flag to change."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFRaw
from tokenizers import models, pre_tokenizers

from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.tokenizer import (
    ByteTokenizer,
    CJKTokenizer,
    HFTokenizer,
    YTTMTokenizer,
    check_caption_lengths,
    load_tokenizer,
    normalize_caption,
    resolve_tokenizer,
    same_tokenizer,
    tokenize,
    tokenizer_from_dict,
)
from dalle_dist.errors import ConfigError, DataError


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


# -- --chinese: one token per CJK character, offline ---------------------------------------

#: Human-written COCO-CN captions (github.com/li-xirong/coco-cn) of COCO_train2014 images
#: 000000067443, 000000071128 and 000000025401, and a second caption of 000000067443.
COCO_CN = ["草地上有一只狗跳起来接飞盘。", "一只狗在沙滩上奔跑。", "一只小狗趴在田野上",
           "一只斗牛犬衔着一只足球奔跑着。"]


def test_cjk_round_trips_real_chinese_captions() -> None:
    """Bug caught: an off-by-one in a range's base id (a character decoded as its
    neighbour), or CJK characters spelled in bytes instead of one token each."""
    tok = load_tokenizer(TokenizerConfig(chinese=True))
    assert isinstance(tok, CJKTokenizer)
    for caption in COCO_CN:
        ids = tok.encode(caption)
        assert len(ids) == len(caption), "one token per character, punctuation included"
        assert all(257 <= i < tok.vocab_size for i in ids), "no byte fallback, no unknown id"
        assert tok.decode(ids) == caption
    encoded = [tuple(tok.encode(c)) for c in COCO_CN]
    assert len(set(encoded)) == len(COCO_CN), "distinct captions, distinct ids"
    # Every character keeps its own id: the ids of the captions map 1:1 to characters.
    chars = {ch: i for c in COCO_CN for ch, i in zip(c, tok.encode(c), strict=True)}
    assert len(set(chars.values())) == len(chars)
    # Latin text and characters outside the ranges (emoji) go through bytes, and back.
    mixed = "a 狗 on 草地 🙂 ok。"
    assert tok.decode([0, *tok.encode(mixed), 0]) == mixed  # padding dropped
    assert tokenizer_from_dict(tok.to_dict()).encode(COCO_CN[0]) == tok.encode(COCO_CN[0])


def test_cjk_vocabulary_covers_every_code_point_of_its_ranges() -> None:
    """Bug caught: ranges whose ids overlap (two characters, one id)."""
    tok = CJKTokenizer()
    # normalize_caption lower-cases and folds the ideographic space: those characters
    # reach encode changed, so they are left out
    points = [p for lo, hi in CJKTokenizer.CJK_RANGES for p in range(lo, hi + 1)
              if normalize_caption(chr(p)) == chr(p)]
    ids = [tok.encode(chr(p)) for p in points]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == len(ids) and max(i[0] for i in ids) == tok.vocab_size - 1
    assert tok.decode([i[0] for i in ids]) == "".join(chr(p) for p in points)


# -- --bpe_path without --hug: YouTokenToMe ------------------------------------------------

@pytest.fixture(scope="module")
def yttm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BPE model trained by youtokentome itself on shapes captions."""
    import youtokentome as yttm

    root = tmp_path_factory.mktemp("yttm")
    corpus = root / "captions.txt"
    corpus.write_text("\n".join(["a small red circle on the left", "a large blue square at the "
                                 "top", "a green triangle in the middle"] * 20))
    yttm.BPE.train(data=str(corpus), vocab_size=60, model=str(root / "bpe.model"))
    return root / "bpe.model"


def test_yttm_ids_are_youtokentomes(yttm_model: Path, tmp_path: Path) -> None:
    """Bug caught: ids shifted (a YouTokenToMe model keeps 0 for padding itself), or a
    checkpoint that needs the model file to exist at generate time."""
    import youtokentome as yttm

    own = yttm.BPE(model=str(yttm_model))
    tok = load_tokenizer(TokenizerConfig(bpe_path=str(yttm_model)))
    assert isinstance(tok, YTTMTokenizer) and tok.vocab_size == own.vocab_size() == 60
    text = "a small blue circle on the left"
    assert tok.encode(text) == own.encode([text], output_type=yttm.OutputType.ID)[0]
    assert 0 not in tok.encode(text)
    assert tok.decode([*tok.encode(text), 0, 0]) == text
    values = tok.to_dict()
    copy = tmp_path / "copy.model"
    copy.write_bytes(yttm_model.read_bytes())
    rebuilt = tokenizer_from_dict(values)  # from the dict alone
    assert rebuilt.encode(text) == tok.encode(text) and rebuilt.vocab_size == 60
    assert same_tokenizer(values, load_tokenizer(TokenizerConfig(bpe_path=str(copy))).to_dict())


@pytest.mark.parametrize("content", [b"", b"hello world", b"\xff\xd8\xff\xe0 binary", b"1 2"])
def test_yttm_refuses_files_that_are_no_model(tmp_path: Path, content: bytes) -> None:
    """youtokentome loads each of these without complaint and reports a made-up vocabulary
    (32571 for an empty file): bug caught, the layout check skipped."""
    path = tmp_path / "bad.model"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_tokenizer(TokenizerConfig(bpe_path=str(path)))
    message = str(info.value)
    assert "is not a YouTokenToMe model" in message and str(path) in message
    assert "--hug" in message and "\n" not in message


def test_yttm_refuses_a_truncated_model(yttm_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.model"
    path.write_bytes(yttm_model.read_bytes()[:200])
    with pytest.raises(DataError, match="header promises"):
        load_tokenizer(TokenizerConfig(bpe_path=str(path)))


def test_hf_json_without_hug_names_hug(word_tokenizer_path: Path) -> None:
    """DALLE-pytorch's --bpe_path without --hug is YouTokenToMe: a tokenizers JSON there
    is a one-line error saying to add --hug, not a YouTokenToMe load of a JSON file."""
    with pytest.raises(DataError) as info:
        load_tokenizer(TokenizerConfig(bpe_path=str(word_tokenizer_path)))
    assert "add --hug" in str(info.value)


def test_missing_youtokentome_is_a_one_line_error(yttm_model: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "youtokentome", None)  # import fails as if absent
    with pytest.raises(ConfigError) as info:
        load_tokenizer(TokenizerConfig(bpe_path=str(yttm_model)))
    message = str(info.value)
    assert "youtokentome is not installed" in message and "--hug" in message


@pytest.mark.parametrize(("config", "fragment"), [
    (TokenizerConfig(chinese=True, bpe_path="x.json", hug=True), "both choose"),
    (TokenizerConfig(hug=True), "--hug needs --bpe_path"),
])
def test_contradicting_tokenizer_flags(config: TokenizerConfig, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_tokenizer(config)


# -- a checkpoint's tokenizer decides --------------------------------------------------------

def test_checkpoint_tokenizer_and_flags(word_tokenizer_path: Path, tmp_path: Path) -> None:
    """Bug caught: flags silently replacing the tokenizer a model was trained with."""
    carried = load_tokenizer(hug(word_tokenizer_path)).to_dict()
    # No flags, or the same file (even saved with other whitespace): the carried one.
    assert isinstance(resolve_tokenizer(carried, TokenizerConfig(), "ckpt"), HFTokenizer)
    respaced = tmp_path / "respaced.json"
    respaced.write_text(json.dumps(json.loads(word_tokenizer_path.read_text()), indent=4))
    assert resolve_tokenizer(carried, hug(respaced), "ckpt").encode("a red circle") == [2, 5, 7]
    # Another tokenizer: an error naming both and the way out.
    with pytest.raises(ConfigError) as info:
        resolve_tokenizer(carried, TokenizerConfig(chinese=True), "--dalle_path d.pt")
    message = str(info.value)
    assert "--chinese is not the tokenizer --dalle_path d.pt was trained with" in message
    assert "HuggingFace" in message and "leave out" in message
    with pytest.raises(ConfigError, match="not the tokenizer"):
        resolve_tokenizer(ByteTokenizer().to_dict(), hug(word_tokenizer_path), "ckpt")
    # A checkpoint without a tokenizer takes the flags'.
    assert isinstance(resolve_tokenizer(None, TokenizerConfig(chinese=True), "c"), CJKTokenizer)
