"""Text tokenizers: byte-level by default; --chinese one token per CJK character;
--hug --bpe_path a HuggingFace `tokenizers` JSON; --bpe_path alone a YouTokenToMe model,
or CLIP's merges file (DALLE-pytorch's default tokenizer: data/clip_bpe.py).

Id 0 is padding in every tokenizer here; the DALLE model turns each padding slot into its
own token. A tokenizer serialises to a plain dict so a checkpoint alone can rebuild it
(`tokenizer_from_dict`), and generate holds the flags it is given against that dict
(`resolve_tokenizer`).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from dalle_dist.data.clip_bpe import HEADER as CLIP_HEADER
from dalle_dist.data.clip_bpe import CLIPTokenizer, merges_text
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.errors import ConfigError, DalleDistError, DataError


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
            reason = " ".join(str(exc).split())[:200]  # one line, whatever the library says
            raise DataError(f"--hug --bpe_path {path} is not a HuggingFace tokenizers JSON "
                            f"({reason})", "save one with tokenizers' Tokenizer.save(path)"
                            ) from None

    def encode(self, text: str) -> list[int]:
        return [i + 1 for i in self._tok.encode(text).ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([i - 1 for i in ids if i > 0])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "hf", "json": self.json_text}


class CJKTokenizer:
    """--chinese: one token per CJK character, UTF-8 bytes (as ByteTokenizer) for the rest.

    DALLE-pytorch's --chinese downloads bert-base-chinese, whose WordPiece vocabulary also
    splits Chinese text into single characters; this needs no file and no network, and
    has no unknown token: a character outside the ranges below (rare ideographs, emoji)
    is spelled in bytes. Ids: 1..256 bytes, then one id per code point of CJK_RANGES.
    """

    #: CJK symbols and punctuation, CJK unified ideographs, half- and full-width forms
    CJK_RANGES = ((0x3000, 0x303F), (0x4E00, 0x9FFF), (0xFF00, 0xFFEF))
    vocab_size = 257 + sum(hi - lo + 1 for lo, hi in CJK_RANGES)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for char in normalize_caption(text):
            code = self._code_id(ord(char))
            if code is None:
                ids.extend(b + 1 for b in char.encode("utf-8"))
            else:
                ids.append(code)
        return ids

    def _code_id(self, point: int) -> int | None:
        base = 257
        for lo, hi in self.CJK_RANGES:
            if lo <= point <= hi:
                return base + point - lo
            base += hi - lo + 1
        return None

    def _code_point(self, token: int) -> int | None:
        offset = token - 257
        for lo, hi in self.CJK_RANGES:
            if 0 <= offset <= hi - lo:
                return lo + offset
            offset -= hi - lo + 1
        return None

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        pending = bytearray()  # a character spelled in bytes spans several ids
        for i in ids:
            if 0 < i <= 256:
                pending.append(i - 1)
                continue
            point = self._code_point(i)
            if point is None:
                continue  # padding, or an id of the model's own (its padding slots)
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            out.append(chr(point))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "cjk"}


class YTTMTokenizer:
    """A YouTokenToMe BPE model (DALLE-pytorch's --bpe_path without --hug).

    Its ids are used as they are: YouTokenToMe keeps 0 for padding itself (1 is its
    unknown token). The model file's bytes travel in the checkpoint, so generate needs
    no copy of it.
    """

    def __init__(self, model_bytes: bytes,
                 what: str = "--bpe_path without --hug names a YouTokenToMe model") -> None:
        yttm = import_youtokentome(what)
        problem = yttm_model_problem(model_bytes)
        if problem is not None:
            raise ValueError(problem)
        self.model_bytes = model_bytes
        # youtokentome reads a model only from a path
        fd, name = tempfile.mkstemp(suffix=".yttm")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(model_bytes)
            self._bpe = yttm.BPE(model=name)
        finally:
            os.unlink(name)
        self._yttm = yttm
        self.vocab_size = self._bpe.vocab_size()

    @classmethod
    def from_file(cls, path: str | Path) -> YTTMTokenizer:
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataError(f"--bpe_path {path} does not exist",
                            "give a YouTokenToMe model, or --hug with a HuggingFace "
                            "tokenizers JSON") from None
        except OSError as exc:
            raise DataError(f"--bpe_path {path} cannot be read ({exc})") from None
        if _is_hf_json(data):
            raise DataError(f"--bpe_path {path} is a HuggingFace tokenizers JSON, and without "
                            "--hug --bpe_path names a YouTokenToMe model (DALLE-pytorch's "
                            "meaning)", "add --hug")
        try:
            return cls(data)
        except DalleDistError:
            raise
        except Exception as exc:  # youtokentome raises bare ValueError / RuntimeError
            reason = " ".join(str(exc).split())[:200]
            raise DataError(f"--bpe_path {path} is not a YouTokenToMe model ({reason})",
                            "train one with youtokentome, or pass --hug with a HuggingFace "
                            "tokenizers JSON") from None

    def encode(self, text: str) -> list[int]:
        return self._bpe.encode([text], output_type=self._yttm.OutputType.ID)[0]

    def decode(self, ids: Sequence[int]) -> str:
        kept = [i for i in ids if 0 < i < self.vocab_size]
        return self._bpe.decode([kept], ignore_ids=[0])[0] if kept else ""

    def to_dict(self) -> dict[str, Any]:
        # base64 text: a checkpoint stays plain types for torch.load(weights_only=True)
        return {"kind": "yttm", "model": base64.b64encode(self.model_bytes).decode("ascii")}


def yttm_model_problem(data: bytes) -> str | None:
    """Why `data` is not a YouTokenToMe BPE model, or None.

    youtokentome itself loads any file, an empty one included, and reports a vocabulary
    of whatever its memory held, so the layout is checked here: a line `chars rules`,
    one `code_point id` line per character, one `left right merged` line per rule, and
    the special ids `unk pad bos eos`, with padding at 0 (DALLE-pytorch's convention,
    and ours: id 0 is padding in every tokenizer).
    """
    try:
        rows = [[int(x) for x in line.split()] for line in data.decode("ascii").splitlines()]
    except (UnicodeDecodeError, ValueError):
        return "not the text of integers a YouTokenToMe model file holds"
    if not rows or len(rows[0]) != 2 or min(rows[0]) < 0:
        return "no `characters rules` header line"
    n_chars, n_rules = rows[0]
    if len(rows) != n_chars + n_rules + 2:
        return (f"the header promises {n_chars} characters and {n_rules} rules, the file has "
                f"{len(rows) - 2} lines for them")
    vocab = n_chars + n_rules + 4
    body = rows[1:-1]
    widths = [2] * n_chars + [3] * n_rules
    if any(len(row) != width for row, width in zip(body, widths, strict=True)):
        return "a character or rule line has the wrong number of fields"
    ids = [row[1] for row in body[:n_chars]] + [i for row in body[n_chars:] for i in row]
    if any(not 0 <= i < vocab for i in ids):
        return "an id outside the vocabulary"
    special = rows[-1]
    if len(special) != 4 or any(not 0 <= i < vocab for i in special):
        return "no valid `unk pad bos eos` line"
    if special[1] != 0:
        return f"its padding id is {special[1]}, not 0 (train it with pad_id=0, the default)"
    return None


def import_youtokentome(what: str) -> Any:
    """youtokentome, or the one-line error saying it is missing and what to use instead;
    `what` says why it is needed."""
    try:
        import youtokentome
    except ImportError:
        raise ConfigError(
            f"{what}, and youtokentome is not installed (pip install Cython, then pip "
            "install --no-build-isolation 'dalle_dist[yttm]')",
            "or convert the tokenizer to a HuggingFace tokenizers JSON and pass --hug "
            "--bpe_path FILE.json") from None
    return youtokentome


def _is_hf_json(data: bytes) -> bool:
    """Whether a file reads as a HuggingFace tokenizers JSON (a model section)."""
    try:
        values = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(values, dict) and "model" in values


def load_tokenizer(config: TokenizerConfig | None = None) -> Tokenizer:
    """The tokenizer the flags name: --chinese, --hug --bpe_path, --bpe_path, or bytes."""
    config = config or TokenizerConfig()
    if config.chinese and config.bpe_path:
        raise ConfigError("--chinese and --bpe_path both choose the tokenizer",
                          "give one of them")
    if config.hug and not config.bpe_path:
        raise ConfigError("--hug needs --bpe_path", "name the HuggingFace tokenizers JSON "
                          "with --bpe_path FILE.json")
    if config.chinese:
        return CJKTokenizer()
    if config.bpe_path:
        if config.hug:
            return HFTokenizer.from_file(config.bpe_path)
        merges = _clip_merges(config.bpe_path)
        if merges is not None:
            return CLIPTokenizer(merges)
        return YTTMTokenizer.from_file(config.bpe_path)
    return ByteTokenizer()


def _clip_merges(path: str | Path) -> str | None:
    """The text of CLIP's merges file if `path` is one (DALLE-pytorch's default
    tokenizer: data/clip_bpe.py), else None (a missing file is YTTMTokenizer's to report)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if not (head.startswith(CLIP_HEADER.encode()) or head[:2] == b"\x1f\x8b"):
                return None
            return merges_text(head + f.read())
    except OSError:
        return None


def tokenizer_from_dict(values: dict[str, Any]) -> Tokenizer:
    kind = values.get("kind")
    if kind == "hf":
        return HFTokenizer(values["json"])
    if kind == "cjk":
        return CJKTokenizer()
    if kind == "clip":
        return CLIPTokenizer.from_dict(values)
    if kind == "yttm":
        return YTTMTokenizer(base64.b64decode(values["model"]),
                             "the checkpoint's tokenizer is a YouTokenToMe model")
    return ByteTokenizer()


def same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two tokenizer dicts describe the same tokenizer (a JSON compared as data,
    so the same file saved with other whitespace still counts as the same)."""
    if a.get("kind", "byte") != b.get("kind", "byte"):
        return False
    if a.get("kind") == "hf":
        return json.loads(a["json"]) == json.loads(b["json"])
    return a == b


def resolve_tokenizer(carried: dict[str, Any] | None, config: TokenizerConfig,
                      where: str) -> Tokenizer:
    """The tokenizer of a run that reads a checkpoint (`where` names it).

    A checkpoint that carries its tokenizer decides: the flags may repeat it, and a
    different one is an error, since the model's text embedding was trained on its ids.
    Only a checkpoint without one takes the tokenizer from the flags.
    """
    if carried is None:
        return load_tokenizer(config)
    if config.given:
        wanted = load_tokenizer(config)
        if not same_tokenizer(wanted.to_dict(), carried):
            raise ConfigError(
                f"{config.describe()} is not the tokenizer {where} was trained with "
                f"({_describe_dict(carried)})", "leave out --bpe_path, --hug and --chinese: "
                "the checkpoint carries its tokenizer")
    return tokenizer_from_dict(carried)


def _describe_dict(values: dict[str, Any]) -> str:
    return {"hf": "a HuggingFace tokenizers JSON", "cjk": "--chinese",
            "yttm": "a YouTokenToMe model", "clip": "CLIP's BPE, DALLE-pytorch's default"
            }.get(values.get("kind", "byte"), "byte-level")


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

