"""The held-out split (--val_fraction): a sample is held out when a hash of its key falls
below the fraction.

The key names the sample itself (a folder image's path relative to the folder, without
its extension; a WebDataset sample's __key__; a built-in shape's index), so the split is
the same on every rank, after a resume, for any number of ranks or loader workers, and in
whatever order the data is listed: no RNG, no position, only the name decides.
"""

from __future__ import annotations

import hashlib

from dalle_dist.errors import ConfigError

#: Salt of the hash: a split of its own, not correlated with other hashes of the same keys.
SPLIT_SALT = b"dalle_dist/val-split/v1\0"


def check_fraction(fraction: float) -> None:
    """--val_fraction must be in [0, 1): 1 would leave nothing to train on."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"--val_fraction must be in [0, 1), got {fraction}",
                          "e.g. 0.05 holds out about 5% of the samples; 0 holds out none")


def held_out(key: str, fraction: float) -> bool:
    """Whether the sample named `key` belongs to the validation part."""
    if fraction <= 0.0:
        return False
    digest = hashlib.blake2b(SPLIT_SALT + key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def split_indices(keys: list[str], fraction: float) -> tuple[list[int], list[int]]:
    """(training indices, held-out indices) of the samples named by `keys`."""
    train, val = [], []
    for index, key in enumerate(keys):
        (val if held_out(key, fraction) else train).append(index)
    return train, val


def check_split(train: int, val: int, fraction: float, what: str) -> None:
    """Both parts must hold samples once --val_fraction is on."""
    if fraction <= 0.0:
        return
    if val == 0:
        raise ConfigError(f"--val_fraction {fraction} holds out none of the {train} {what}",
                          "raise --val_fraction or add data")
    if train == 0:
        raise ConfigError(f"--val_fraction {fraction} leaves no training data: all {val} "
                          f"{what} are held out", "lower --val_fraction or add data")
