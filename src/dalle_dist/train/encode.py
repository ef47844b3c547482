"""`dalle-dist encode`: a data set's images through the frozen image tokenizer once, into
token shards (data/token_shards.py) that `train --token_shards` reads with no image
decoding and no encoder in its loop (docs/training.md, "Encode once").

Shard k holds samples [k x shard_size, (k + 1) x shard_size) of the source in its own
order, so a token shard's sample i is the image data set's sample i: the same sampler
draws the same samples from either, and a run from shards equals a run from the images
(without random crops). Rank r of W encodes shards r, r + W, ...; each is written whole
and renamed into place, and rank 0 writes the manifest once every shard is complete. A
rerun keeps the shards of the same encode (same source, tokenizer and shard size: their
`encode_id`) and writes the rest.

Each image is read as held-out data is: the largest centred square, resized. Captions
are stored as text, every line of a caption file, and tokenized when training.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dalle_dist.backends import DistributedBackend, DistributedConfig
from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.config_base import DictConfig, option
from dalle_dist.data import DataConfig
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.encode_sources import (
    ImageSource,
    ImageUnreadable,
    encode_source,
    view_names,
    views,
)
from dalle_dist.data.token_shards import (
    MANIFEST,
    read_manifest,
    shard_is_complete,
    shard_meta,
    shard_name,
    token_dtype,
    write_manifest,
    write_shard,
)
from dalle_dist.data.tokenizer import check_caption_lengths, load_tokenizer, tokenize
from dalle_dist.errors import ConfigError, OutputError
from dalle_dist.fileio import ensure_writable_dir
from dalle_dist.model.config import DALLEConfig
from dalle_dist.model.image_tokenizer import ImageTokenizer, content_hash
from dalle_dist.train.config import DalleRun
from dalle_dist.train.cpu_settings import HEAP_KEPT_ENCODE, keep_heap
from dalle_dist.train.run_log import RunLog


@dataclass(frozen=True)
class EncodeConfig(DictConfig):
    output: str | None = option(
        None, "folder to write the token shards and their manifest.json into (a rerun "
        "into the same folder finishes an interrupted encode)", metavar="DIR",
        default_text="required")
    shard_size: int = option(10_000, "source images per shard file (each gives --crops x "
                             "(2 with --flip) samples)", metavar="N")
    crops: int = option(1, "samples per image: its largest centred square, then N - 1 random "
                        "square crops of --random_resize_crop_lower_ratio to all of its area "
                        "(LlamaGen's ten-crop idea), each a sample with its own key",
                        metavar="N")
    flip: bool = option(False, "also encode each view mirrored left to right, as a sample "
                        "of its own")
    encode_batch_size: int = option(64, "images encoded at once per rank", metavar="N",
                                    name="--batch_size")

    def validate(self) -> None:
        if not self.output:
            raise ConfigError("encode needs --output DIR", "name the folder to write the "
                              "token shards into")
        if self.shard_size < 1:
            raise ConfigError(f"--shard_size must be >= 1, got {self.shard_size}")
        if self.encode_batch_size < 1:
            raise ConfigError(f"--batch_size must be >= 1, got {self.encode_batch_size}")
        if self.crops < 1:
            raise ConfigError(f"--crops must be >= 1, got {self.crops}",
                              "1 encodes the centred square alone")


@dataclass
class EncodeJob:
    """Everything `dalle-dist encode` reads."""

    encode: EncodeConfig = field(default_factory=EncodeConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    text_seq_len: int = DALLEConfig.text_seq_len
    run: DalleRun = field(default_factory=DalleRun)
    taming: TamingConfig = field(default_factory=TamingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    tf32: bool = True

    def validate(self) -> None:
        self.encode.validate()
        if self.text_seq_len < 1:
            raise ConfigError(f"--text_seq_len must be >= 1, got {self.text_seq_len}")


def source_record(data: DataConfig, keys: list[str]) -> dict[str, Any]:
    """What the shards were encoded from: the folder (or the shapes' count and seed) and
    a hash of every sample's key in order."""
    record: dict[str, Any] = (
        {"builtin_shapes": {"count": data.shapes_count, "seed": data.shapes_seed}}
        if data.builtin else {"image_text_folder": str(Path(data.image_text_folder).resolve())})
    record["keys_sha256"] = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    return record


def encode_images(job: EncodeJob, backend: DistributedBackend,
                  tokenizer_of: Any) -> dict[str, Any]:
    """Encode the data set of `job` on this rank's shards; returns the manifest.

    tokenizer_of(data_cfg, log) -> the image tokenizer (train.commands.image_tokenizer,
    passed in: that module imports this one's command)."""
    cfg = job.encode
    out = Path(cfg.output)
    # before the tokenizer (the built-in VAE may train first) and the source's scan
    backend.everywhere("the output check", lambda: ensure_writable_dir(out, "--output"))
    log = RunLog(None, backend.is_root)
    vae: ImageTokenizer = tokenizer_of(job.data, log)
    vae = vae.to(backend.device).eval()
    data_cfg = replace(job.data, image_size=vae.config.image_size,
                       channels=vae.config.channels)
    source = encode_source(data_cfg, vae.config.image_size, vae.config.channels)
    log.info(source.describe())
    keys = source.keys()
    text = backend.everywhere("the tokenizer load", lambda: load_tokenizer(job.tokenizer))
    check_caption_lengths(text, [line for i in range(len(source))
                                 for line in source.caption_lines(i)],
                          job.text_seq_len, data_cfg.truncate_captions)
    text_record = {"kind": text.to_dict().get("kind", "bytes"), "vocab_size": text.vocab_size,
                   "sha256": hashlib.sha256(json.dumps(text.to_dict(), sort_keys=True)
                                            .encode()).hexdigest(),
                   "text_seq_len": job.text_seq_len,
                   "truncate_captions": data_cfg.truncate_captions}
    tokenizer_record = {"sha256": content_hash(vae), **{
        k: getattr(vae.config, k) for k in ("image_size", "fmap_size", "num_tokens",
                                            "channels")},
        "kind": type(vae).__name__}
    view = {"crops": cfg.crops, "flip": cfg.flip, "per_image": cfg.crops * (2 if cfg.flip else 1),
            "lower_ratio": data_cfg.resize_ratio if cfg.crops > 1 else 1.0}
    encode_id = hashlib.sha256(json.dumps(
        [tokenizer_record, source_record(data_cfg, keys), cfg.shard_size, view, text_record],
        sort_keys=True).encode()).hexdigest()[:16]
    backend.on_root("the output check", lambda: _check_output(out, encode_id))

    count = len(source)
    shards = [(k, k * cfg.shard_size, min((k + 1) * cfg.shard_size, count))
              for k in range((count + cfg.shard_size - 1) // cfg.shard_size)]
    mine = shards[backend.rank::backend.world_size]
    todo = [s for s in mine if not shard_is_complete(out / shard_name(s[0]), s[1:], encode_id)]
    if len(todo) < len(mine):
        log.info(f"{len(mine) - len(todo)} of this rank's {len(mine)} shard(s) are complete "
                 "from an earlier encode: kept")
    samples = sum(end - start for _, start, end in todo)
    if keep_heap(backend.device):  # each batch's activations reuse the last one's memory
        log.info(HEAP_KEPT_ENCODE)
    started = time.perf_counter()
    with tqdm(total=samples, unit="img", desc=f"encode (rank {backend.rank})",
              disable=not backend.is_root, dynamic_ncols=True) as bar:
        for index, start, end in todo:
            _encode_shard(vae, source, keys, out / shard_name(index), (start, end),
                          cfg.encode_batch_size, backend.device, encode_id, bar, view,
                          lambda lines: tokenize(text, lines, job.text_seq_len,
                                                 data_cfg.truncate_captions))
    seconds = time.perf_counter() - started
    backend.barrier("the other ranks' shards")

    def finish() -> dict[str, Any]:
        metas = [shard_meta(out / shard_name(k)) for k, _, _ in shards]
        incomplete = [shard_name(k) for (k, start, end), meta in zip(shards, metas, strict=True)
                      if meta is None or meta.get("encode_id") != encode_id
                      or meta.get("source_range") != [start, end]]
        if incomplete:
            raise OutputError(f"--output {out}: {len(incomplete)} shard(s) are missing "
                              f"after every rank finished, e.g. {incomplete[0]}",
                              "run the same encode again: it writes only what is missing")
        unreadable = [key for meta in metas for key in meta["skipped"]]
        manifest = {
            "encode_id": encode_id, "image_tokenizer": tokenizer_record,
            "text_tokenizer": text_record,
            "source": source_record(data_cfg, keys), "source_samples": count,
            "samples": sum(meta["samples"] for meta in metas),
            "shard_size": cfg.shard_size,
            "token_dtype": str(token_dtype(vae.config.num_tokens)).removeprefix("torch."),
            # the largest centred square resized, then random crops, each maybe mirrored
            "view": view,
            # what the source's scan left out, and the images that did not decode
            "skipped": source.skipped(), "unreadable_images": unreadable,
            "shards": [{"name": shard_name(k), "start": start, "samples": meta["samples"]}
                       for (k, start, _), meta in zip(shards, metas, strict=True)]}
        write_manifest(out, manifest)
        return manifest

    manifest = backend.on_root("the manifest", finish)
    rate = samples / seconds if seconds > 0 else 0.0
    unreadable = manifest["unreadable_images"]
    log.info(f"encoded {samples} images on this rank in {seconds:.1f} s ({rate:.1f} img/s); "
             f"{out / MANIFEST}: {manifest['samples']} samples in {len(shards)} shard(s) of "
             f"{vae.config.fmap_size}x{vae.config.fmap_size} tokens of "
             f"{vae.config.num_tokens}" + (
                 f"; skipped {len(unreadable)} unreadable images, e.g. {unreadable[0]}"
                 if unreadable else ""))
    return manifest


def _encode_shard(vae: ImageTokenizer, source: ImageSource, keys: list[str], path: Path,
                  source_range: tuple[int, int], batch_size: int, device: torch.device,
                  encode_id: str, bar: Any, view: dict[str, Any],
                  tokenize_lines: Callable[[list[str]], torch.Tensor]) -> None:
    """Images [start, end) of `source` through `vae`, each as its views' samples, written
    as one shard; an image that does not decode is left out and named in the shard's
    metadata. An image's random crops are drawn from a generator seeded by its key: a
    rerun, or another rank count, draws the same ones."""
    start, end = source_range
    size, channels = vae.config.image_size, vae.config.channels
    rows: list[torch.Tensor] = []
    captions: list[str] = []
    row_keys: list[str] = []
    row_views: list[str] = []
    text_ids: list[torch.Tensor] = []
    skipped: list[str] = []
    for first in range(start, end, batch_size):
        images: list[torch.Tensor] = []
        for i in range(first, min(first + batch_size, end)):
            try:
                picture = source.picture(i)
            except ImageUnreadable:
                skipped.append(keys[i])
                continue
            seed = int(hashlib.sha256(keys[i].encode()).hexdigest()[:15], 16)
            images += views(picture, size, channels, view["crops"], view["flip"],
                            view["lower_ratio"], torch.Generator().manual_seed(seed))
            row_keys += [keys[i]] * view["per_image"]
            row_views += view_names(view["crops"], view["flip"])
            lines = source.caption_lines(i)
            captions += ["\n".join(lines)] * view["per_image"]
            text_ids += [tokenize_lines(lines)] * view["per_image"]
        if images:
            with torch.no_grad():
                rows.append(vae.get_codebook_indices(torch.stack(images).to(device)).cpu())
        bar.update(min(first + batch_size, end) - first)
    fmap = vae.config.fmap_size
    tokens = torch.cat(rows) if rows else torch.zeros(0, fmap * fmap, dtype=torch.long)
    write_shard(path, tokens, captions, row_keys, vae.config.num_tokens, encode_id,
                source_range, skipped, text_ids, row_views)


def _check_output(out: Path, encode_id: str) -> None:
    """An output folder holding another encode's manifest is not written over; what a
    killed encode left half-written (a shard's temporary file) goes."""
    for leftover in out.glob(".shard-*.tmp"):
        leftover.unlink(missing_ok=True)
    if (out / MANIFEST).exists():
        previous = read_manifest(out, "--output")
        if previous.get("encode_id") != encode_id:
            raise OutputError(f"--output {out} holds token shards of another encode "
                              "(another source, image tokenizer or --shard_size)",
                              "choose another --output, or remove that folder first")
