"""WebDataset shards (`--wds img,cap`, as DALLE-pytorch): a folder of .tar files or a brace
pattern, split by rank, then by loader worker.

Ranks must take the same number of steps (a rank that runs out first would leave the
others waiting in an all-reduce), so the shards are indexed once up front: sample counts
per rank fix the steps per epoch, and the captions are checked against --text_seq_len
before training, not in the middle of it. Indexing reads tar headers and caption files
only. `webdataset` is imported lazily (the `webdataset` extra).
"""

from __future__ import annotations

import io
import itertools
import math
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from dalle_dist.data.heldout import WeightedBatch, padded
from dalle_dist.data.images import center_crop, pil_to_tensor, random_resized_crop, to_mode
from dalle_dist.data.loader import PREFETCH_FACTOR
from dalle_dist.data.split import check_split, held_out
from dalle_dist.errors import DataError

#: Samples held in the shuffle buffer of each loader worker.
SHUFFLE_BUFFER = 1000


def parse_keys(spec: str, require_caption: bool) -> tuple[str, str | None]:
    """'img,cap' -> ('img', 'cap'): the member extensions holding image and caption."""
    keys = [k.strip().lstrip(".") for k in spec.split(",") if k.strip()]
    if len(keys) != 2 and not (len(keys) == 1 and not require_caption):
        raise DataError(f"--wds {spec!r} must name the image and caption keys",
                        "e.g. --wds jpg,txt")
    return keys[0], keys[1] if len(keys) == 2 else None


def shard_paths(spec: str) -> list[Path]:
    """A folder's *.tar files, or the files a brace pattern (shard-{000..009}.tar) names."""
    from braceexpand import braceexpand  # a dependency of webdataset

    path = Path(spec)
    if path.is_dir():
        shards = sorted(path.glob("*.tar"))
    else:
        shards = [Path(p) for p in braceexpand(spec)]
        missing = [str(p) for p in shards if not p.is_file()]
        if missing:
            raise DataError(f"WebDataset shard {missing[0]} does not exist "
                            f"({len(missing)} of {len(shards)} missing)", "check the pattern")
    if not shards:
        raise DataError(f"--image_text_folder {spec} holds no .tar shards",
                        "give a folder of WebDataset shards or a brace pattern")
    return shards


#: WebDataset's own split of a member name into the sample's __key__ and the extension
#: (webdataset.tariterators.base_plus_ext): up to the first dot of the file name.
MEMBER_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def split_key(shard: str | Path, key: str) -> str:
    """The name the held-out split hashes: the shard's file name and the sample's __key__
    (keys often restart in every shard)."""
    return f"{Path(shard).name}/{key}"


@dataclass
class ShardIndex:
    path: Path
    samples: int
    captions: list[str]
    keys: list[str]  # the usable samples' __key__s

    def held_out(self, fraction: float) -> int:
        """How many of the usable samples the split holds out."""
        return sum(held_out(split_key(self.path, key), fraction) for key in self.keys)


def index_shard(path: Path, image_key: str, caption_key: str | None) -> ShardIndex:
    """Count the samples that have every needed member, reading only captions' bytes."""
    members: dict[str, dict[str, tarfile.TarInfo]] = {}
    try:
        with tarfile.open(path) as tar:
            for info in tar:
                match = MEMBER_NAME.match(info.name)
                if not info.isfile() or match is None:
                    continue
                stem, ext = match.groups()
                members.setdefault(stem, {})[ext.lower()] = info
            captions, keys = [], []
            samples = 0
            for stem, files in members.items():
                if image_key not in files or (caption_key and caption_key not in files):
                    continue
                samples += 1
                keys.append(stem)
                if caption_key:
                    raw = tar.extractfile(files[caption_key]).read()
                    captions.append(raw.decode("utf-8", errors="replace").strip())
    except (tarfile.TarError, OSError) as exc:
        raise DataError(f"WebDataset shard {path} cannot be read ({exc})",
                        "check or remove the shard") from None
    return ShardIndex(path, samples, captions, keys)


def _to_sample(image_key: str, caption_key: str | None, image_size: int, resize_ratio: float,
               channels: int = 3, evaluation: bool = False
               ) -> Callable[[dict[str, Any]], tuple[torch.Tensor, str]]:
    """evaluation: the held-out way, the same every time (centred crop, first caption line)."""
    def convert(sample: dict[str, Any]) -> tuple[torch.Tensor, str]:
        with Image.open(io.BytesIO(sample[image_key])) as img:
            image = (center_crop(to_mode(img, channels), image_size) if evaluation else
                     random_resized_crop(to_mode(img, channels), image_size, resize_ratio))
        caption = ""
        if caption_key:
            lines = [line.strip() for line in sample[caption_key].decode("utf-8", "replace")
                     .splitlines() if line.strip()]
            if lines:
                caption = lines[0] if evaluation else lines[int(torch.randint(len(lines), ()))]
        return pil_to_tensor(image, channels), caption
    return convert


class WebDatasetLoader:
    """Batches from this rank's shards; every rank yields the same number per epoch."""

    def __init__(self, spec: str, keys: str, image_size: int, resize_ratio: float,
                 batch_size: int, rank: int, world_size: int, seed: int, num_workers: int,
                 collate: Callable[[Any], Any], require_caption: bool,
                 pin_memory: bool = False, channels: int = 3, val_fraction: float = 0.0) -> None:
        """channels: 3 loads RGB, 4 RGBA (--transparent; opaque images get alpha 1);
        val_fraction: hold out the samples whose shard name and __key__ hash below it
        (data/split.py); training skips them and `held_out` reads them."""
        self.image_key, self.caption_key = parse_keys(keys, require_caption)
        shards = shard_paths(spec)
        if len(shards) < world_size:
            raise DataError(f"{len(shards)} WebDataset shards cannot be split over "
                            f"{world_size} ranks", "use at least one shard per rank")
        self.index = [index_shard(p, self.image_key, self.caption_key) for p in shards]
        self.val_fraction = val_fraction
        self.held_out_counts = [s.held_out(val_fraction) for s in self.index]
        total, val = sum(s.samples for s in self.index), sum(self.held_out_counts)
        check_split(total - val, val, val_fraction, "WebDataset samples")
        if val_fraction > 0:  # from here on a shard's samples are its training samples
            self.index = [ShardIndex(s.path, s.samples - n, s.captions, s.keys)
                          for s, n in zip(self.index, self.held_out_counts, strict=True)]
        self.steps = min(self._batches(self.index[r::world_size], batch_size, num_workers)
                         for r in range(world_size))
        if self.steps == 0:
            raise DataError(f"some rank's WebDataset shards hold fewer than a batch of "
                            f"{batch_size} usable samples",
                            f"check --wds {keys} (keys are the member extensions) or add data")
        self.shards = [str(s.path) for s in self.index[rank::world_size]]
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.collate, self.pin_memory = collate, pin_memory
        self.convert = _to_sample(self.image_key, self.caption_key, image_size, resize_ratio,
                                  channels)
        self.channels = channels
        self.held_out = (WebDatasetHeldOut(self, image_size, world_size, rank)
                         if val_fraction > 0 else None)

    @staticmethod
    def _batches(shards: list[ShardIndex], batch_size: int, num_workers: int) -> int:
        """Full batches a rank's loader yields: each worker batches its own shards
        (split_by_worker deals them out round-robin) and drops its own last partial batch."""
        groups = [shards[w::num_workers] for w in range(num_workers)] if num_workers else [shards]
        return sum(sum(s.samples for s in group) // batch_size for group in groups)

    def __len__(self) -> int:
        return self.steps

    def all_captions(self) -> list[str]:
        return [c for shard in self.index for c in shard.captions]

    def describe(self) -> str:
        total = sum(s.samples for s in self.index)
        held = (f"; {sum(self.held_out_counts)} held out for validation (--val_fraction "
                f"{self.val_fraction})" if self.val_fraction > 0 else "")
        kind = "training samples" if self.val_fraction > 0 else "samples"
        return (f"webdataset: {total} {kind} in {len(self.index)} shards, "
                f"{self.steps} steps per epoch per rank{held}")

    def pipeline(self, shards: list[str], want_held_out: bool, first_group: int = 0) -> Any:
        """The samples of `shards` with every member, of the training part or (with
        want_held_out) of the held-out part, undecoded. Loader worker w reads the shards
        of group (w + first_group) % workers, group g being shards[g::workers]."""
        import webdataset as wds

        keys, fraction = (self.image_key, self.caption_key), self.val_fraction

        def wanted(sample: dict[str, Any]) -> bool:
            return (all(k in sample for k in keys if k) and held_out(
                split_key(sample["__url__"], sample["__key__"]), fraction) == want_held_out)

        return (wds.WebDataset(shards, shardshuffle=False, nodesplitter=None,
                               workersplitter=split_by_worker_from(first_group),
                               empty_check=False,
                               handler=wds.warn_and_continue)
                .select(wanted))

    def worker_batches(self) -> list[int]:
        """Full batches each loader worker yields (the main process: one entry): a worker
        batches its own shards, split_by_worker deals them out round-robin."""
        workers = max(self.num_workers, 1)
        counts = [s.samples for s in self.index if str(s.path) in set(self.shards)]
        return [sum(counts[w::workers]) // self.batch_size for w in range(workers)]

    def _one_pass(self, seed: int, skip: int = 0) -> Iterator[Any]:
        """One pass over this rank's shards, less its first `skip` batches, which are
        dropped before decoding (see skip_before_decode)."""
        import webdataset as wds

        taken, first_group = skipped_per_worker(skip, self.worker_batches())
        # the DataLoader takes its first batch from worker 0: that worker reads the group
        # whose turn it is after the skipped batches
        pipeline = self.pipeline(self.shards, False, first_group).shuffle(
            SHUFFLE_BUFFER, seed=seed)
        if skip:
            pipeline = pipeline.compose(skip_before_decode(taken, first_group,
                                                           self.batch_size))
        pipeline = pipeline.map(self.convert, handler=wds.warn_and_continue)
        # a DataLoader per pass (its shuffle seed differs): workers cannot persist
        return iter(torch.utils.data.DataLoader(
            pipeline, batch_size=self.batch_size, num_workers=self.num_workers,
            collate_fn=self.collate, drop_last=True, pin_memory=self.pin_memory,
            prefetch_factor=PREFETCH_FACTOR if self.num_workers else None))

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """Exactly len(self) batches, from batch `start` on. A resumed run's earlier
        batches are read as undecoded tar members and dropped before decoding: a tar
        stream has no index to seek by, but reading bytes costs a small part of decoding
        and cropping them. The batches that follow are those of an uninterrupted epoch,
        unless an image before `start` failed to decode (then they begin one sample
        later per such image).

        Each sample once, unless undecodable samples were skipped: then a second pass
        tops the epoch up, so this rank does not run short and leave the others waiting
        in an all-reduce."""
        def passes() -> Iterator[Any]:
            for attempt in itertools.count():
                skip = 0 if attempt else start
                produced = 0
                for batch in self._one_pass(self.seed + epoch + 1_000_003 * attempt, skip):
                    produced += 1
                    yield batch
                if produced == 0 and not skip:
                    raise DataError("no sample of this rank's WebDataset shards could be "
                                    "decoded", "check the shards' images")
        return itertools.islice(passes(), self.steps - start)


def skipped_per_worker(skip: int, worker_batches: list[int]) -> tuple[list[int], int]:
    """How many of the first `skip` batches each shard group (worker) made, and the group
    whose turn is next. A DataLoader takes batches from its workers in turn, passing over
    a worker that has run out."""
    taken = [0] * len(worker_batches)
    group = 0
    for _ in range(min(skip, sum(worker_batches))):
        while taken[group] >= worker_batches[group]:
            group = (group + 1) % len(taken)
        taken[group] += 1
        group = (group + 1) % len(taken)
    return taken, group


def split_by_worker_from(first_group: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """webdataset's split_by_worker with the groups rotated: worker w takes the shards
    g, g + workers, ... of g = (w + first_group) % workers."""
    def split(shards: Iterator[Any]) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            yield from shards
            return
        group = (info.id + first_group) % info.num_workers
        for i, shard in enumerate(shards):
            if i % info.num_workers == group:
                yield shard
    return split


def skip_before_decode(per_group: list[int], first_group: int, batch_size: int
                       ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A pipeline stage that drops this worker's group's share of the skipped batches,
    as undecoded samples."""
    def stage(samples: Iterator[Any]) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        group = (info.id + first_group) % info.num_workers if info is not None else 0
        return itertools.islice(samples, per_group[group] * batch_size, None)
    return stage


class WebDatasetHeldOut:
    """This rank's held-out WebDataset samples (from its own shards), in order, in as many
    batches as the rank with the most takes (data/heldout.py pads the others)."""

    def __init__(self, source: WebDatasetLoader, image_size: int, world_size: int,
                 rank: int) -> None:
        self.source, self.batch_size = source, source.batch_size
        counts = source.held_out_counts
        self.samples = sum(counts)
        self.steps = max(math.ceil(sum(counts[r::world_size]) / self.batch_size)
                         for r in range(world_size))
        self.convert = _to_sample(source.image_key, source.caption_key, image_size, 1.0,
                                  source.channels, evaluation=True)

    def __len__(self) -> int:
        return self.steps

    def _loader(self) -> Iterator[Any]:
        import webdataset as wds

        pipeline = self.source.pipeline(self.source.shards, True).map(
            self.convert, handler=wds.warn_and_continue)
        # in the main process: the batch count must not depend on how workers split shards
        return iter(torch.utils.data.DataLoader(pipeline, batch_size=self.batch_size,
                                                collate_fn=self.source.collate))

    def batches(self) -> Iterator[WeightedBatch]:
        """This rank's held-out batches with their weights; len(self) of them."""
        return padded(self._loader(), self.steps, self.first_batch)

    def first_batch(self) -> Any:
        """The first held-out batch of the rank's shards (the sample grids' captions); a
        rank whose shards hold none reads the first of all shards'."""
        batch = next(self._loader(), None)
        if batch is not None:
            return batch
        return next(self._everywhere(self.batch_size))

    def _everywhere(self, batch_size: int) -> Iterator[Any]:
        """The held-out samples of all shards, in shard order, in batches."""
        import webdataset as wds

        everywhere = [str(s.path) for s in self.source.index]
        pipeline = self.source.pipeline(everywhere, True).map(
            self.convert, handler=wds.warn_and_continue)
        return iter(torch.utils.data.DataLoader(pipeline, batch_size=batch_size,
                                                collate_fn=self.source.collate))

    def head(self, count: int) -> Any:
        """The first `count` held-out samples of all shards (fewer if they hold fewer) as
        one batch, the same on any rank and world size."""
        return next(self._everywhere(count), None)
