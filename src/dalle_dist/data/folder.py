"""Image-text folders in DALLE-pytorch's layout: `name.png` beside `name.txt`.

The folder is scanned once up front, so an empty or unusable folder fails before any
training, and the log can say exactly how many files were skipped and why.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from dalle_dist.data.images import center_crop, pil_to_tensor, random_resized_crop, to_mode
from dalle_dist.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


@dataclass
class ScanReport:
    """What the scan found; `summary()` is the log line."""

    usable: int = 0
    unreadable_images: list[Path] = field(default_factory=list)
    empty_captions: list[Path] = field(default_factory=list)
    missing_captions: list[Path] = field(default_factory=list)

    def skipped(self) -> list[str]:
        parts = []
        if self.unreadable_images:
            parts.append(f"skipped {len(self.unreadable_images)} unreadable images")
        if self.empty_captions:
            parts.append(f"skipped {len(self.empty_captions)} empty caption files")
        if self.missing_captions:
            parts.append(f"ignored {len(self.missing_captions)} images without a .txt caption")
        return parts

    def summary(self, what: str) -> str:
        return ", ".join([f"{self.usable} {what} found", *self.skipped()])


def _readable(path: Path) -> bool:
    try:
        with Image.open(path) as img:
            img.verify()
        return True
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError):
        return False


def _caption_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


class TextImageFolder(Dataset):
    """Item i is (image [C, S, S] in [0, 1], caption), a random caption line each time;
    C is 3 (RGB) or 4 (RGBA, --transparent: alpha kept, opaque images get alpha 1).

    With require_captions=False (VAE training) every readable image counts, captioned or not.
    A held-out part (`subset(..., evaluation=True)`) is read the same way every time: the
    largest centred square and the first caption line, so its loss is a fixed number.
    """

    evaluation = False

    def __init__(self, root: str | Path, image_size: int, resize_ratio: float = 0.75,
                 require_captions: bool = True, flag: str = "--image_text_folder",
                 channels: int = 3) -> None:
        root = Path(root)
        if not root.exists():
            raise DataError(f"{flag} {root} does not exist", "check the path")
        if not root.is_dir():
            raise DataError(f"{flag} {root} is not a folder", "give a folder of images")
        if not 0.0 < resize_ratio <= 1.0:
            raise DataError("--random_resize_crop_lower_ratio must be in (0, 1], "
                            f"got {resize_ratio}")
        self.root, self.image_size, self.resize_ratio = root, image_size, resize_ratio
        self.channels = channels
        self.report = ScanReport()
        self.images: list[Path] = []
        self.captions: list[list[str]] = []
        for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS):
            caption_path = path.with_suffix(".txt")
            lines: list[str] = []
            if caption_path.exists():
                lines = _caption_lines(caption_path)
                if not lines and require_captions:
                    self.report.empty_captions.append(caption_path)
                    continue
            elif require_captions:
                self.report.missing_captions.append(path)
                continue
            if not _readable(path):
                self.report.unreadable_images.append(path)
                continue
            self.images.append(path)
            self.captions.append(lines)
        self.report.usable = len(self.images)
        if not self.images:
            what = "image-text pairs (name.png beside name.txt)" if require_captions else "images"
            found = "; ".join(self.report.skipped()) or "the folder is empty"
            raise DataError(f"{flag} {root} holds no usable {what} ({found})",
                            f"add images with extensions {', '.join(IMAGE_EXTENSIONS)}")

    def __len__(self) -> int:
        return len(self.images)

    def all_captions(self) -> list[str]:
        return [line for lines in self.captions for line in lines]

    def caption_lines(self, index: int) -> list[str]:
        """Every caption line of image `index` (training draws one at random)."""
        return list(self.captions[index])

    def keys(self) -> list[str]:
        """Each image's name for the held-out split: its path below the folder, without
        the extension (the same on every machine the folder is copied to)."""
        return [path.relative_to(self.root).with_suffix("").as_posix() for path in self.images]

    def subset(self, indices: list[int], evaluation: bool = False) -> TextImageFolder:
        """The images at `indices`; evaluation: read without random crops or captions."""
        part = copy.copy(self)
        part.images = [self.images[i] for i in indices]
        part.captions = [self.captions[i] for i in indices]
        part.evaluation = evaluation
        return part

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        # verify() at scan time does not decode pixels: a truncated file can still fail here.
        for attempt in range(len(self)):
            path = self.images[(index + attempt) % len(self)]
            try:
                with Image.open(path) as img:
                    image = (center_crop(to_mode(img, self.channels), self.image_size)
                             if self.evaluation else
                             random_resized_crop(to_mode(img, self.channels), self.image_size,
                                                 self.resize_ratio))
                break
            except OSError:
                continue
        else:
            raise DataError("no image in the folder could be decoded", "check the image files")
        index = (index + attempt) % len(self)
        lines = self.captions[index]
        if not lines:
            caption = ""
        else:
            caption = lines[0] if self.evaluation else lines[int(torch.randint(len(lines), ()))]
        return pil_to_tensor(image, self.channels), caption
