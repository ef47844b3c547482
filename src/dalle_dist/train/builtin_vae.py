"""The VAE `train` uses on built-in data when no --vae_path is given: trained once, cached.

The cache key covers everything that shapes the VAE (its config, schedule, training
settings and the data), so changing any of them trains a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from dalle_dist.data import DataConfig
from dalle_dist.model import VAEConfig
from dalle_dist.train.config import BUILTIN_VAE_EPOCHS, TrainConfig, VAESchedule

#: The built-in VAE's training run: about 1,500 steps, short enough to run on a CPU before
#: `train` (how long: docs/benchmarks.md).
BUILTIN_VAE_TRAIN = TrainConfig(epochs=BUILTIN_VAE_EPOCHS, batch_size=32, learning_rate=1e-3,
                                clip_grad_norm=None, save_every_n_steps=0,
                                sample_every_n_steps=0, seed=0)


def default_cache_dir() -> Path:
    if "DALLE_DIST_CACHE" in os.environ:
        return Path(os.environ["DALLE_DIST_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "dalle_dist"


@dataclass(frozen=True)
class BuiltinVAE:
    """How the built-in VAE is trained, and where it is cached."""

    vae: VAEConfig
    schedule: VAESchedule
    train: TrainConfig
    data: DataConfig
    path: Path

    @property
    def partial_path(self) -> Path:
        """Training writes here and renames at the end: an interrupted run is never reused."""
        return self.path.with_name(self.path.stem + ".partial.pt")


def builtin_vae(data: DataConfig, cache_dir: Path | None = None,
                epochs: int = BUILTIN_VAE_TRAIN.epochs) -> BuiltinVAE:
    """The built-in VAE for `data`'s image size and seed, trained for `epochs` epochs of
    the default 10,000 shapes (--builtin_vae_epochs: fewer for a quick try, more for a
    sharper VAE; each count has its own cache entry)."""
    vae_cfg = VAEConfig(image_size=data.image_size)
    schedule = VAESchedule()
    data = DataConfig(image_size=data.image_size, shapes_seed=data.shapes_seed,
                      num_workers=data.num_workers)
    train = replace(BUILTIN_VAE_TRAIN, epochs=epochs)
    # How many processes draw the shapes changes no image (each is a function of seed and
    # index), so the key holds 0, the count every key was made with before --num_workers
    # had a per-device default: cached VAEs stay found.
    key_data = replace(data, num_workers=0).to_dict()
    # The built-in VAE is RGB: channels (added for --transparent) stays out of the key, so
    # VAEs cached before it existed stay found.
    del key_data["channels"]
    del key_data["token_shards"]  # likewise (and a VAE is trained on images only)
    vae_data = vae_cfg.to_dict()
    # decoder_stem (added for VAEs imported from DALLE-pytorch) is always on here: out of
    # the key, which stays every earlier cache's
    del vae_data["decoder_stem"]
    key_source = json.dumps([vae_data, schedule.to_dict(), train.to_dict(),
                             key_data], sort_keys=True)
    key = hashlib.sha256(key_source.encode()).hexdigest()[:12]
    path = (cache_dir or default_cache_dir()) / "vae" / f"shapes-{data.image_size}px-{key}.pt"
    return BuiltinVAE(vae_cfg, schedule, train, data, path)
