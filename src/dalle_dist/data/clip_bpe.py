"""DALLE-pytorch's default tokenizer: OpenAI CLIP's byte-level BPE (its SimpleTokenizer,
49408 ids), built from CLIP's merges file `bpe_simple_vocab_16e6.txt` (DALLE-pytorch ships
it in its package data, OpenAI's CLIP as .gz), given as `--bpe_path`.

The BPE runs in HuggingFace `tokenizers` (a dependency already), set up as CLIP's own
rules: NFC, whitespace runs to one space, lower case; words split by CLIP's pattern
(contractions, letter runs, single digits, other symbol runs); their UTF-8 bytes mapped
to CLIP's printable alphabet; merges applied with `</w>` ending each word. Before that,
HTML entities are unescaped twice, as CLIP's basic_clean does; its ftfy repair of mojibake
is not applied (captions in valid UTF-8 do not need it).

Ids are used as they are, as DALLE-pytorch uses them: CLIP's id 0 is `!`, which DALLE-pytorch
(and so a model trained there) reads as padding.
"""

from __future__ import annotations

import base64
import gzip
import html
from collections.abc import Sequence
from typing import Any

#: the first line of CLIP's merges file
HEADER = '"bpe_simple_vocab_16e6.txt#version: 0.2'
#: CLIP's vocabulary: 256 bytes, the same ending a word, 48894 merges, two markers
VOCAB_SIZE = 49408
_MERGES = VOCAB_SIZE - 2 * 256 - 2
_PATTERN = (r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|"""
            r"""[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""")


def merges_text(data: bytes) -> str | None:
    """The merges file's text if `data` is CLIP's merges file (plain or gzipped), else
    None."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.startswith(HEADER) else None


def _byte_alphabet() -> list[str]:
    """CLIP's (and GPT-2's) printable stand-in for each byte value, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


class CLIPTokenizer:
    """DALLE-pytorch's SimpleTokenizer, the same ids (tests/data/test_clip_bpe.py compares
    it with DALLE-pytorch 1.6.6's own)."""

    vocab_size = VOCAB_SIZE

    def __init__(self, text: str) -> None:
        from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import BPE

        self.text = text
        merges = [tuple(line.split()) for line in text.split("\n")[1:_MERGES + 1]]
        alphabet = _byte_alphabet()
        # the order the ids follow: bytes in CLIP's order (printable ones first)
        ordered = sorted(alphabet, key=ord)
        vocab = [*ordered, *(c + "</w>" for c in ordered), *("".join(m) for m in merges),
                 "<|startoftext|>", "<|endoftext|>"]
        self._ids = {token: i for i, token in enumerate(vocab)}
        self._tokens = vocab
        self._bytes = {c: b for b, c in enumerate(alphabet)}
        bpe = BPE(vocab=self._ids, merges=merges, end_of_word_suffix="</w>", fuse_unk=False)
        self._tok = Tokenizer(bpe)
        self._tok.normalizer = normalizers.Sequence(
            [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
        self._tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(html.unescape(html.unescape(text)).strip()).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Caption ids -> text (id 0 is padding, as in DALLE-pytorch; markers dropped)."""
        out = bytearray()
        for i in ids:
            if not 0 < i < VOCAB_SIZE - 2:
                continue
            token = self._tokens[i]
            out += bytes(self._bytes[c] for c in token.removesuffix("</w>"))
            if token.endswith("</w>"):
                out += b" "
        return out.decode("utf-8", errors="replace").strip()

    def to_dict(self) -> dict[str, Any]:
        packed = gzip.compress(self.text.encode("utf-8"), mtime=0)
        return {"kind": "clip", "merges": base64.b64encode(packed).decode("ascii")}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CLIPTokenizer:
        return cls(gzip.decompress(base64.b64decode(values["merges"])).decode("utf-8"))
