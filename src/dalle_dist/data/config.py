"""Where the training data comes from."""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.config_base import DictConfig


@dataclass(frozen=True)
class DataConfig(DictConfig):
    """image_text_folder None means the built-in shapes dataset."""

    image_text_folder: str | None = None
    wds: str | None = None  # "img,cap": image_text_folder holds WebDataset shards
    image_size: int = 32
    truncate_captions: bool = False
    resize_ratio: float = 0.75
    shapes_count: int = 10_000
    shapes_seed: int = 0
    num_workers: int = 0

    @property
    def builtin(self) -> bool:
        return self.image_text_folder is None

