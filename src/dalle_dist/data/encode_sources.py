"""The data sets `dalle-dist encode` reads, by index, each sample as held-out data is read:
the largest centred square, resized, and every caption line.

Training's own readers stand in a neighbour for an image that fails to decode (a step
must get a full batch); an encode must not file one image's tokens under another's key,
so here an undecodable image raises ImageUnreadable and the encode skips and counts it.

Sample i of a source is sample i of the data set `train` reads from the same flags (a
folder's sorted files, the shapes' indices, the WebDataset shards in order and their
samples in tar order), and its key is the one the held-out split hashes.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from dalle_dist.data.config import DataConfig
from dalle_dist.data.folder import TextImageFolder
from dalle_dist.data.images import center_crop, pil_to_tensor, random_resized_crop, to_mode
from dalle_dist.data.shapes import ShapesDataset, render
from dalle_dist.data.wds import MEMBER_NAME, parse_keys, shard_paths, split_key
from dalle_dist.errors import ConfigError, DataError


class ImageUnreadable(Exception):
    """Sample's image bytes do not decode."""


class ImageSource(Protocol):
    def __len__(self) -> int: ...

    def keys(self) -> list[str]: ...

    def caption_lines(self, index: int) -> list[str]: ...

    def picture(self, index: int) -> Image.Image:
        """The decoded image, whole, in the tokenizer's mode; raises ImageUnreadable."""
        ...

    def describe(self) -> str: ...

    def skipped(self) -> list[str]:
        """What the source's scan left out, for the manifest."""
        ...


def _decode(data: bytes | Path, channels: int) -> Image.Image:
    try:
        with Image.open(data if isinstance(data, Path) else io.BytesIO(data)) as img:
            img.load()
            return to_mode(img, channels)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageUnreadable(str(exc)) from None


def views(picture: Image.Image, size: int, channels: int, crops: int, flip: bool,
          lower_ratio: float, generator: torch.Generator) -> list[torch.Tensor]:
    """The samples one image gives: its largest centred square, then crops - 1 random
    square crops of [lower_ratio, 1] of its area (drawn from `generator`), each resized
    to `size`; with flip each is followed by its mirror image."""
    squares = [center_crop(picture, size)] + [
        random_resized_crop(picture, size, lower_ratio, generator) for _ in range(crops - 1)]
    out = []
    for square in squares:
        out.append(pil_to_tensor(square, channels))
        if flip:
            out.append(pil_to_tensor(ImageOps.mirror(square), channels))
    return out


def view_names(crops: int, flip: bool) -> list[str]:
    """The views' names, in views' order: "" for the centred square, "j" for crop j, a
    trailing "f" for a mirror image ("0f": the centred square's). A shard row keeps its
    image's key and its view's name apart, so the held-out split hashes the image's key
    (all of an image's views stay on one side) whatever characters the key holds."""
    names = [""] + [str(j) for j in range(1, crops)]
    if not flip:
        return names
    return [n for name in names for n in (name, (name or "0") + "f")]


class FolderSource:
    def __init__(self, folder: TextImageFolder) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def keys(self) -> list[str]:
        return self.folder.keys()

    def caption_lines(self, index: int) -> list[str]:
        return self.folder.caption_lines(index)

    def picture(self, index: int) -> Image.Image:
        return _decode(self.folder.images[index], self.folder.channels)

    def describe(self) -> str:
        return self.folder.report.summary("image-text pairs")

    def skipped(self) -> list[str]:
        return self.folder.report.skipped()


class ShapesSource:
    def __init__(self, shapes: ShapesDataset) -> None:
        self.shapes = shapes

    def __len__(self) -> int:
        return len(self.shapes)

    def keys(self) -> list[str]:
        return self.shapes.keys()

    def caption_lines(self, index: int) -> list[str]:
        return self.shapes.caption_lines(index)

    def picture(self, index: int) -> Image.Image:
        shapes = self.shapes
        spec = shapes.spec(index if shapes.indices is None else shapes.indices[index])
        return to_mode(render(spec, shapes.image_size), shapes.channels)

    def describe(self) -> str:
        return f"built-in shapes: {len(self.shapes)} images of {self.shapes.image_size}px"

    def skipped(self) -> list[str]:
        return []


@dataclass
class _Member:
    shard: int
    image: tarfile.TarInfo
    captions: list[str]


class WebDatasetSource:
    """WebDataset .tar shards (img2dataset's output as it is), indexed once: every
    sample's image member and caption; an image is read from its tar by offset."""

    def __init__(self, spec: str, wds_keys: str, image_size: int, channels: int) -> None:
        image_key, caption_key = parse_keys(wds_keys, require_caption=True)
        self.paths = shard_paths(spec)
        self.image_size, self.channels = image_size, channels
        self.samples: list[_Member] = []
        self._keys: list[str] = []
        self.incomplete = 0
        for shard, path in enumerate(self.paths):
            members: dict[str, dict[str, tarfile.TarInfo]] = {}
            try:
                with tarfile.open(path) as tar:
                    for info in tar:
                        match = MEMBER_NAME.match(info.name)
                        if info.isfile() and match is not None:
                            stem, ext = match.groups()
                            members.setdefault(stem, {})[ext.lower()] = info
                    for stem, files in members.items():
                        if image_key not in files or caption_key not in files:
                            self.incomplete += 1
                            continue
                        raw = tar.extractfile(files[caption_key]).read()
                        lines = [line.strip() for line in raw.decode("utf-8", "replace")
                                 .splitlines() if line.strip()]
                        self.samples.append(_Member(shard, files[image_key], lines or [""]))
                        self._keys.append(split_key(path, stem))
            except (tarfile.TarError, OSError) as exc:
                raise DataError(f"WebDataset shard {path} cannot be read ({exc})",
                                "check or remove the shard") from None
        if not self.samples:
            raise DataError(f"--image_text_folder {spec} holds no sample with both "
                            f"--wds members {wds_keys}", "check the member extensions")
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def keys(self) -> list[str]:
        return list(self._keys)

    def caption_lines(self, index: int) -> list[str]:
        return list(self.samples[index].captions)

    def picture(self, index: int) -> Image.Image:
        member = self.samples[index]
        tar = self._open.get(member.shard)
        if tar is None:  # shards are read in order: keep one open
            for old in self._open.values():
                old.close()
            self._open = {member.shard: tarfile.open(self.paths[member.shard])}
            tar = self._open[member.shard]
        return _decode(tar.extractfile(member.image).read(), self.channels)

    def describe(self) -> str:
        return f"webdataset: {len(self)} samples in {len(self.paths)} shards"

    def skipped(self) -> list[str]:
        return ([f"ignored {self.incomplete} samples without both members"]
                if self.incomplete else [])


def encode_source(config: DataConfig, image_size: int, channels: int) -> ImageSource:
    """The source `config` names, read at the image tokenizer's size."""
    if config.builtin:
        if config.shapes_count <= 0:
            raise ConfigError(f"--shapes_count must be positive, got {config.shapes_count}")
        return ShapesSource(ShapesDataset(config.shapes_count, image_size, config.shapes_seed,
                                          channels))
    if config.wds:
        return WebDatasetSource(config.image_text_folder, config.wds, image_size, channels)
    return FolderSource(TextImageFolder(config.image_text_folder, image_size,
                                        require_captions=True, channels=channels))
