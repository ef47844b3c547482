"""Text tokenizers: byte-level by default, HuggingFace `tokenizers` JSON with --bpe_path.

Id 0 is padding in every tokenizer here; the DALLE model turns each padding slot into its
own token. A tokenizer serialises to a plain dict so a checkpoint alone can rebuild it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from dalle_dist.errors import DataError


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


def normalize_caption(text: str) -> str:
    """Lower case with single spaces, as DALLE-pytorch's tokenizer cleans text."""
    return " ".join(text.lower().split())


class ByteTokenizer:
    """UTF-8 bytes shifted by one (ids 1..256); needs no vocabulary file."""

    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return [b + 1 for b in normalize_caption(text).encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - 1 for i in ids if 0 < i <= 256).decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "byte"}


class HFTokenizer:
    """A HuggingFace `tokenizers` JSON; its ids are shifted by one to keep 0 for padding."""

    def __init__(self, json_text: str) -> None:
        from tokenizers import Tokenizer as _HF

        self.json_text = json_text
        self._tok = _HF.from_str(json_text)
        self.vocab_size = self._tok.get_vocab_size() + 1

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            return cls(text)
        except FileNotFoundError:
            raise DataError(f"--bpe_path {path} does not exist",
                            "give a HuggingFace tokenizers JSON file") from None
        except (OSError, UnicodeDecodeError, Exception) as exc:  # tokenizers raises bare Exception
            raise DataError(f"--bpe_path {path} is not a HuggingFace tokenizers JSON ({exc})",
                            "save one with tokenizers' Tokenizer.save(path)") from None

    def encode(self, text: str) -> list[int]:
        return [i + 1 for i in self._tok.encode(text).ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([i - 1 for i in ids if i > 0])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "hf", "json": self.json_text}


def load_tokenizer(bpe_path: str | None) -> Tokenizer:
    return HFTokenizer.from_file(bpe_path) if bpe_path else ByteTokenizer()


def tokenizer_from_dict(values: dict[str, Any]) -> Tokenizer:
    if values.get("kind") == "hf":
        return HFTokenizer(values["json"])
    return ByteTokenizer()


def caption_too_long(caption: str, n_tokens: int, text_seq_len: int) -> DataError:
    shown = caption if len(caption) <= 60 else caption[:57] + "..."
    return DataError(
        f"caption {shown!r} is {n_tokens} tokens, longer than --text_seq_len {text_seq_len}",
        "pass --truncate_captions or raise --text_seq_len",
    )


def tokenize(tokenizer: Tokenizer, texts: Sequence[str], context_length: int,
             truncate: bool = False) -> torch.Tensor:
    """Captions -> [len(texts), context_length] ids, right-padded with 0."""
    out = torch.zeros(len(texts), context_length, dtype=torch.long)
    for row, text in enumerate(texts):
        ids = tokenizer.encode(text)
        if len(ids) > context_length:
            if not truncate:
                raise caption_too_long(text, len(ids), context_length)
            ids = ids[:context_length]
        out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def check_caption_lengths(tokenizer: Tokenizer, captions: Sequence[str], context_length: int,
                          truncate: bool) -> None:
    """Fail before training when a caption would not fit and truncation is off."""
    if truncate:
        return
    for caption in captions:
        n = len(tokenizer.encode(caption))
        if n > context_length:
            raise caption_too_long(caption, n, context_length)

