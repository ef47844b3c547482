"""Token shards: a data set whose images were encoded once by a frozen image tokenizer
(`dalle-dist encode`), so `train --token_shards DIR` reads token ids and never decodes an
image or runs the encoder (docs/training.md, "Encode once").

The layout of DIR:

- `shard-NNNNNN.safetensors`: samples [start, start + n) of the source, in its order. No
  pickle: safetensors holds `image_tokens` [n, fmap^2] (the smallest integer dtype that
  holds the codebook), and each sample's caption (its lines, "\\n"-joined) and key as
  UTF-8 bytes with offsets. Captions are tokenized when training, as from images, so one
  encode serves any tokenizer and --text_seq_len.
- `manifest.json`: the image tokenizer (content hash, image size, grid, codebook), the
  source, the shards and their counts. Written last, by one process, once every shard is
  on disk: a directory without it is an encode still running or cut short, and a rerun
  keeps the shards already complete (each is written whole and renamed into place).

Nothing here knows about models: the encoder's hash and the tokens come from the caller.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from dalle_dist.errors import DataError
from dalle_dist.fileio import atomic_path, atomic_writer

FORMAT = "dalle-dist token shards"
VERSION = 1
MANIFEST = "manifest.json"
METADATA_KEY = "dalle_dist"
#: open shard files kept per process: a shuffled epoch reads rows of every shard in turn
OPEN_SHARDS = 64


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.safetensors"


def token_dtype(num_tokens: int) -> torch.dtype:
    """The smallest integer dtype that holds ids 0..num_tokens-1 (safetensors has no
    uint16 for torch)."""
    if num_tokens <= 256:
        return torch.uint8
    if num_tokens <= 2**15:
        return torch.int16
    return torch.int32


def _strings(values: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """UTF-8 bytes of all values back to back, and the n + 1 offsets between them."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = torch.zeros(len(encoded) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(e) for e in encoded], dtype=torch.int64).cumsum(0)
    data = torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8) if any(
        encoded) else torch.zeros(0, dtype=torch.uint8)
    return data, offsets


def write_shard(path: Path, tokens: torch.Tensor, captions: Sequence[str],
                keys: Sequence[str], num_tokens: int, encode_id: str,
                source_range: tuple[int, int], skipped: Sequence[str] = (),
                text_ids: Sequence[torch.Tensor] | None = None,
                views: Sequence[str] | None = None) -> None:
    """One shard, complete or absent: written beside `path` and renamed into place.
    encode_id names the encode it belongs to (source, tokenizer, shard size);
    source_range the source's samples [start, end) it covers, of which `skipped` (keys)
    could not be read and have no row. text_ids: per row, its caption lines' token ids
    [lines, text_seq_len] (stored as `text_ids` with `text_offsets` into it); views: per
    row, the name of the image's view it holds ("" the centred square: encode_sources)."""
    from safetensors.torch import save_file

    if not len(captions) == len(keys) == tokens.shape[0]:
        raise ValueError("one caption and one key per row of tokens")
    caption_bytes, caption_offsets = _strings(captions)
    key_bytes, key_offsets = _strings(keys)
    tensors = {"image_tokens": tokens.to(token_dtype(num_tokens)).contiguous(),
               "caption_bytes": caption_bytes, "caption_offsets": caption_offsets,
               "key_bytes": key_bytes, "key_offsets": key_offsets}
    if views is not None:
        tensors["view_bytes"], tensors["view_offsets"] = _strings(views)
    if text_ids is not None:
        lines = torch.tensor([0] + [len(ids) for ids in text_ids], dtype=torch.int64)
        tensors["text_offsets"] = lines.cumsum(0)
        tensors["text_ids"] = (torch.cat(list(text_ids)).to(torch.int32) if text_ids
                               else torch.zeros(0, 0, dtype=torch.int32))
    with atomic_path(path) as tmp:
        # one metadata entry: safetensors writes several in hash order, so the same shard
        # would not be the same bytes twice
        save_file(tensors, str(tmp), metadata={METADATA_KEY: json.dumps(
            {"format": FORMAT, "version": VERSION, "encode_id": encode_id,
             "samples": tokens.shape[0], "source_range": list(source_range),
             "skipped": list(skipped)}, sort_keys=True)})


def shard_meta(path: Path) -> dict[str, Any] | None:
    """What a shard says of itself (encode_id, samples, source_range, skipped), or None
    for a file that is not a whole shard."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(METADATA_KEY, "{}"))
            rows = f.get_slice("image_tokens").get_shape()[0]
    except Exception:  # unreadable, cut short or foreign
        return None
    if meta.get("format") != FORMAT or meta.get("samples") != rows:
        return None
    return meta


def shard_is_complete(path: Path, source_range: tuple[int, int], encode_id: str) -> bool:
    """Whether `path` is a whole shard of samples [start, end) written by the encode
    `encode_id` (a rerun keeps it)."""
    meta = shard_meta(path)
    return (meta is not None and meta.get("encode_id") == encode_id
            and meta.get("source_range") == list(source_range))


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    with atomic_writer(directory / MANIFEST) as f:
        f.write(json.dumps({"format": FORMAT, "version": VERSION, **manifest},
                           indent=1, sort_keys=True).encode())


def read_manifest(directory: str | Path, flag: str = "--token_shards") -> dict[str, Any]:
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise DataError(f"{flag} {directory} is not a folder", "give the folder "
                        "dalle-dist encode wrote (--output)")
    if not path.exists():
        raise DataError(f"{flag} {directory} has no {MANIFEST}: not token shards, or an "
                        "encode that has not finished", "run (or finish) dalle-dist encode "
                        f"--output {directory}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{flag} {path} cannot be read: {exc}", "encode again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or (
            manifest.get("version") != VERSION):
        raise DataError(f"{flag} {path} is not a {FORMAT} manifest of version {VERSION}",
                        "encode again with this version of dalle-dist")
    return manifest


def manifest_sha256(directory: str | Path) -> str:
    """What a checkpoint records of the shards it was trained on."""
    return hashlib.sha256((Path(directory) / MANIFEST).read_bytes()).hexdigest()


class TokenShards(Dataset):
    """Item i is (image token ids [fmap^2] int64, caption), read from shard rows through
    safetensors' memory map: one row at a time, no shard is read whole.

    A caption of several lines gives a random line each time, drawn as TextImageFolder
    draws it; a held-out part (`subset(..., evaluation=True)`) always gives the first."""

    evaluation = False

    def __init__(self, directory: str | Path, flag: str = "--token_shards") -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory, flag)
        self.shards = [s["name"] for s in self.manifest["shards"]]
        counts = [int(s["samples"]) for s in self.manifest["shards"]]
        self.starts = [0, *torch.tensor(counts, dtype=torch.int64).cumsum(0).tolist()]
        missing = [n for n in self.shards if not (self.directory / n).exists()]
        if missing:
            raise DataError(f"{flag} {self.directory}: {len(missing)} shard(s) of the "
                            f"manifest are missing, e.g. {missing[0]}", "copy the whole "
                            "folder, or encode again")
        self.rows: list[int] | None = None  # a subset's global rows
        self._open: OrderedDict[str, Any] = OrderedDict()

    @property
    def image_tokenizer(self) -> dict[str, Any]:
        return self.manifest["image_tokenizer"]

    def __getstate__(self) -> dict[str, Any]:  # loader workers open their own files
        return {**self.__dict__, "_open": OrderedDict()}

    def __len__(self) -> int:
        return self.starts[-1] if self.rows is None else len(self.rows)

    def _file(self, shard: int) -> Any:
        from safetensors import safe_open

        name = self.shards[shard]
        handle = self._open.pop(name, None)
        if handle is None:
            handle = safe_open(str(self.directory / name), framework="pt")
            if len(self._open) >= OPEN_SHARDS:
                self._open.popitem(last=False)
        self._open[name] = handle
        return handle

    def _locate(self, index: int) -> tuple[int, int]:
        row = index if self.rows is None else self.rows[index]
        shard = bisect.bisect_right(self.starts, row) - 1
        return shard, row - self.starts[shard]

    @staticmethod
    def _string(handle: Any, name: str, i: int) -> str:
        start, end = handle.get_slice(f"{name}_offsets")[i:i + 2].tolist()
        return bytes(handle.get_slice(f"{name}_bytes")[start:end].numpy()).decode("utf-8")

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        shard, i = self._locate(index)
        handle = self._file(shard)
        tokens = handle.get_slice("image_tokens")[i].to(torch.int64)
        lines = self._string(handle, "caption", i).split("\n")
        caption = lines[0] if self.evaluation or len(lines) == 1 else lines[
            int(torch.randint(len(lines), ()))]
        return tokens, caption

    def text_ids(self, index: int) -> torch.Tensor:
        """Sample `index`'s caption lines as the encode's text tokenizer wrote them:
        [lines, text_seq_len] int64, 0-padded (training tokenizes the caption itself,
        with its own tokenizer and --text_seq_len)."""
        shard, i = self._locate(index)
        handle = self._file(shard)
        start, end = handle.get_slice("text_offsets")[i:i + 2].tolist()
        return handle.get_slice("text_ids")[start:end].to(torch.int64)

    def _all(self, name: str) -> list[str]:
        """Every row's string `name` (caption or key), in order, of the whole directory."""
        values: list[str] = []
        for shard in range(len(self.shards)):
            handle = self._file(shard)
            data = bytes(handle.get_tensor(f"{name}_bytes").numpy())
            offsets = handle.get_tensor(f"{name}_offsets").tolist()
            values += [data[a:b].decode("utf-8") for a, b in itertools.pairwise(offsets)]
        return values if self.rows is None else [values[r] for r in self.rows]

    def keys(self) -> list[str]:
        """Each sample's image's key, as its source named it: the held-out split's hash
        input, so all views of one image fall on one side."""
        return self._all("key")

    def sample_keys(self) -> list[str]:
        """Each sample's own name: its image's key, and KEY#VIEW for a crop or mirror
        image (encode --crops / --flip)."""
        keys = self.keys()
        if not self.shards or "view_bytes" not in self._file(0).keys():
            return keys
        return [f"{key}#{view}" if view else key
                for key, view in zip(keys, self._all("view"), strict=True)]

    def all_captions(self) -> list[str]:
        return [line for caption in self._all("caption") for line in caption.split("\n")]

    def subset(self, indices: list[int], evaluation: bool = False) -> TokenShards:
        part = TokenShards.__new__(TokenShards)
        part.__dict__.update(self.__getstate__())
        rows = range(len(self)) if self.rows is None else self.rows
        part.rows = [rows[i] for i in indices]
        part.evaluation = evaluation
        return part
