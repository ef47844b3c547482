"""Memory sizes as `dalle-dist plan` reads them (--gpu_memory) and prints them."""

from __future__ import annotations

import re

from dalle_dist.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6,
          "MIB": 2**20, "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12,
          "TIB": 2**40}


def parse_memory(text: str) -> int:
    """"80GB", "40GiB", "24G", "16000MB" -> bytes. GB, MB and a bare G are decimal (a card
    sold as 80 GB holds at least 80e9 bytes); GiB and MiB binary. A unit is required."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS or unit in ("", "B"):
        raise ConfigError(f"--gpu_memory {text!r} is not a memory size",
                          "give a number and a unit, e.g. 80GB, 40GiB, 24G or 16000MB")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ConfigError(f"--gpu_memory must be positive, got {text!r}")
    return int(value)


def format_bytes(count: float, si: bool = False) -> str:
    """1.5 GiB, 300 MiB (binary), or 80 GB with si."""
    base, names = (1000, ("B", "KB", "MB", "GB", "TB")) if si else (
        1024, ("B", "KiB", "MiB", "GiB", "TiB"))
    value, unit = float(count), names[0]
    for unit in names:
        if abs(value) < base or unit == names[-1]:
            break
        value /= base
    return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.3g} {unit}"
