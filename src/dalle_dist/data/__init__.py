"""Data: tokenizers, image-text folders, the built-in shapes dataset and its scorer.

Nothing here knows about models or distributed backends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from dalle_dist.data.config import DataConfig
from dalle_dist.data.folder import TextImageFolder
from dalle_dist.data.heldout import HeldOutLoader
from dalle_dist.data.loader import EpochLoader
from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.data.split import check_fraction, check_split, split_indices
from dalle_dist.data.token_shards import TokenShards
from dalle_dist.data.tokenizer import Tokenizer, check_caption_lengths, tokenize
from dalle_dist.data.wds import WebDatasetLoader
from dalle_dist.errors import ConfigError, DataError

__all__ = [
    "CaptionCollate",
    "DataConfig",
    "EpochLoader",
    "HeldOutLoader",
    "ShapesDataset",
    "TextImageFolder",
    "TokenShards",
    "WebDatasetLoader",
    "build_dataset",
    "check_captions",
    "describe_dataset",
    "make_loader",
]


def build_dataset(config: DataConfig, image_size: int, require_captions: bool,
                  flag: str = "--image_text_folder") -> Dataset:
    """The shapes dataset or a scanned folder; every item is (image [C, S, S], caption),
    C = config.channels."""
    if config.builtin:
        if config.shapes_count <= 0:
            raise ConfigError(f"--shapes_count must be positive, got {config.shapes_count}")
        if config.shapes_seed < 0:
            raise ConfigError(f"--shapes_seed must be >= 0, got {config.shapes_seed}")
        return ShapesDataset(config.shapes_count, image_size, config.shapes_seed,
                             config.channels)
    return TextImageFolder(config.image_text_folder, image_size, config.resize_ratio,
                           require_captions=require_captions, flag=flag,
                           channels=config.channels)


def describe_dataset(dataset: Dataset) -> str:
    """One log line: what will be trained on, and what was skipped."""
    if isinstance(dataset, TextImageFolder):
        what = "image-text pairs" if any(dataset.captions) else "images"
        return dataset.report.summary(what)
    if isinstance(dataset, TokenShards):
        image = dataset.image_tokenizer
        return (f"token shards {dataset.directory}: {len(dataset)} samples in "
                f"{len(dataset.shards)} shard(s), {image['fmap_size']}x{image['fmap_size']} "
                f"tokens of {image['num_tokens']} ({image['kind']} {image['sha256'][:12]})")
    return f"built-in shapes: {len(dataset)} images of {dataset.image_size}x{dataset.image_size}"


def all_captions(source: Dataset | EpochLoader | WebDatasetLoader) -> list[str]:
    """Every caption training can draw (for shapes: every caption the generator writes)."""
    if isinstance(source, EpochLoader):
        source = source.dataset
    if isinstance(source, ShapesDataset):
        return source.captions()
    return source.all_captions()


def check_captions(source: Dataset | EpochLoader | WebDatasetLoader, tokenizer: Tokenizer,
                   text_seq_len: int, truncate: bool) -> None:
    """Raise before training when a caption of the data is longer than text_seq_len."""
    check_caption_lengths(tokenizer, all_captions(source), text_seq_len, truncate)


def make_loader(config: DataConfig, image_size: int, batch_size: int, rank: int,
                world_size: int, seed: int, collate: CaptionCollate, require_captions: bool,
                flag: str = "--image_text_folder", *, num_workers: int = 0,
                pin_memory: bool = False, val_fraction: float = 0.0
                ) -> tuple[EpochLoader | WebDatasetLoader, str]:
    """This rank's batches and a log line describing the data behind them.

    val_fraction: hold out this fraction of the samples, chosen by a hash of each one's
    key (data/split.py); the loader trains on the rest and its `held_out` (a
    HeldOutLoader, or the WebDataset loader's own) reads the held-out part. 0: none.

    num_workers: the loader processes the run decided on (config.num_workers is what the
    user asked for, None for the default: train.commands resolves it from the device and
    the CPUs); pin_memory: batches land in page-locked memory (worth it only on CUDA)."""
    check_fraction(val_fraction)
    if config.token_shards:  # (TrainJob.validate refuses it beside a folder or --wds)
        dataset: Dataset = TokenShards(config.token_shards)
        return _map_loader(dataset, describe_dataset(dataset), batch_size, rank, world_size,
                           seed, num_workers, collate, pin_memory, val_fraction)
    if config.wds:
        if config.builtin:
            raise DataError("--wds needs WebDataset shards", f"pass them with {flag}")
        loader = WebDatasetLoader(config.image_text_folder, config.wds, image_size,
                                  config.resize_ratio, batch_size, rank, world_size, seed,
                                  num_workers, collate, require_captions, pin_memory,
                                  config.channels, val_fraction)
        return loader, loader.describe()
    dataset = build_dataset(config, image_size, require_captions, flag)
    return _map_loader(dataset, describe_dataset(dataset), batch_size, rank, world_size, seed,
                       num_workers, collate, pin_memory, val_fraction)


def _map_loader(dataset: Dataset, description: str, batch_size: int, rank: int,
                world_size: int, seed: int, num_workers: int, collate: CaptionCollate,
                pin_memory: bool, val_fraction: float) -> tuple[EpochLoader, str]:
    """A data set read by index (folder, shapes, token shards), split by key."""
    held_out = None
    if val_fraction > 0:
        train, val = split_indices(dataset.keys(), val_fraction)
        check_split(len(train), len(val), val_fraction, "samples")
        held_out = HeldOutLoader(dataset.subset(val, evaluation=True), batch_size, rank,
                                 world_size, num_workers, collate, pin_memory)
        dataset = dataset.subset(train)
        description += f"; {len(val)} held out for validation (--val_fraction {val_fraction})"
    loader = EpochLoader(dataset, batch_size, rank, world_size, seed, num_workers, collate,
                         pin_memory)
    loader.held_out = held_out
    return loader, description


class CaptionCollate:
    """Batches (images, caption token ids, captions); a class so loader workers can pickle it."""

    def __init__(self, tokenizer: Tokenizer | None, text_seq_len: int, truncate: bool) -> None:
        self.tokenizer, self.text_seq_len, self.truncate = tokenizer, text_seq_len, truncate

    def __call__(self, batch: Sequence[tuple[torch.Tensor, str]]
                 ) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
        images = torch.stack([image for image, _ in batch])
        captions = [caption for _, caption in batch]
        text = (tokenize(self.tokenizer, captions, self.text_seq_len, self.truncate)
                if self.tokenizer is not None else None)
        return images, text, captions
