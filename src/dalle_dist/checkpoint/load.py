"""Reading a checkpoint of any kind (single file, sharded directory or DeepSpeed
directory), and the models it alone rebuilds.

A DALL-E checkpoint carries its VAE and tokenizer, so `dalle_parts` is all generate and a
resumed run need; an export (checkpoint/export.py) reads back into the same payload form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dalle_dist.checkpoint.deepspeed_dir import (
    consolidated_weights,
    is_ds_checkpoint_dir,
    read_ds_meta,
    tag_ema,
)
from dalle_dist.checkpoint.format import check_kind, read_checkpoint_file
from dalle_dist.checkpoint.sharded_dir import (
    is_sharded_dir,
    read_sharded_meta,
    read_sharded_whole,
)
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.tokenizer import Tokenizer, resolve_tokenizer
from dalle_dist.errors import CheckpointError
from dalle_dist.model import DALLEConfig, ImageTokenizer, image_tokenizer_from_dict


def read_any_checkpoint(path: str | Path, flag: str, keep_ds_dir: bool = False,
                        keep_sharded: bool = False, with_optimizer: bool = True
                        ) -> dict[str, Any]:
    """A single file's payload; a sharded directory's newest save read whole (fp32
    weights, the optimizer by parameter name); or a DeepSpeed directory's metadata with its
    weights consolidated to fp32 (no optimizer state: that stays in DeepSpeed's partitions).

    keep_ds_dir: leave a DeepSpeed directory unconsolidated (`ds_dir`, `ds_tag`, no
    weights), for the deepspeed backend to load itself. keep_sharded: leave a sharded
    directory unread (`sharded_dir`, no weights), for an engine that loads its own shards
    (checkpoint/sharded_dir.load_into_engine). with_optimizer: False reads a sharded
    directory's weights alone (generate, export).
    """
    if is_sharded_dir(path):
        if keep_sharded:
            return {**read_sharded_meta(path, flag), "weights": None, "optimizer": None}
        return read_sharded_whole(path, flag, with_optimizer)
    if not is_ds_checkpoint_dir(path):
        return read_checkpoint_file(path, flag)
    meta = read_ds_meta(path, flag)
    if keep_ds_dir:
        return {**meta, "weights": None, "optimizer": None}
    weights = consolidated_weights(meta["ds_dir"], meta["ds_tag"], flag)
    rest = {k: v for k, v in meta.items() if k not in ("ds_dir", "ds_tag")}
    return {**rest, **tag_ema(meta["ds_dir"], meta["ds_tag"], weights), "weights": weights,
            "optimizer": None}


def load_checkpoint(path: str | Path, flag: str, kind: str, keep_ds_dir: bool = False,
                    keep_sharded: bool = False, with_optimizer: bool = True) -> dict[str, Any]:
    """Read a checkpoint and insist it is of `kind`, naming the right flag when it is not."""
    payload = read_any_checkpoint(path, flag, keep_ds_dir, keep_sharded, with_optimizer)
    check_kind(payload, path, flag, kind)
    return payload


def vae_from_checkpoint(payload: dict[str, Any]) -> ImageTokenizer:
    """The VAE of a VAE checkpoint, or the image tokenizer a DALL-E checkpoint carries (its
    DiscreteVAE or its taming VQGAN, weights included), with weights."""
    configs = payload["configs"]
    if payload["kind"] == "vae":
        config, weights = configs["model"], payload["weights"]
    else:
        config, weights = configs["vae"], payload["vae_weights"]
    vae = image_tokenizer_from_dict(config)
    vae.load_state_dict(weights)
    return vae


def dalle_parts(payload: dict[str, Any], tokenizer: TokenizerConfig | None = None,
                where: str = "the checkpoint") -> tuple[DALLEConfig, ImageTokenizer, Tokenizer]:
    """What a DALL-E checkpoint alone rebuilds: model config, its image tokenizer (VAE or
    VQGAN) and its text tokenizer.

    `tokenizer`: the tokenizer flags of the command (--bpe_path, --hug, --chinese), which
    must agree with the tokenizer the checkpoint carries, and name it only where the
    checkpoint carries none (data.tokenizer.resolve_tokenizer); `where` names the
    checkpoint in messages.
    """
    configs = payload["configs"]
    config = DALLEConfig.from_dict(configs["model"])
    tok = resolve_tokenizer(configs.get("tokenizer"), tokenizer or TokenizerConfig(), where)
    if configs.get("tokenizer") is None and tok.vocab_size != config.num_text_tokens:
        raise CheckpointError(
            f"{where} carries no tokenizer, and {(tokenizer or TokenizerConfig()).describe()} "
            f"has {tok.vocab_size} text tokens where the model has {config.num_text_tokens}",
            "give the tokenizer it was trained with: --bpe_path, --hug or --chinese")
    return config, vae_from_checkpoint(payload), tok
