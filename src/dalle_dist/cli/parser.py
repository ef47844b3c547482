"""argparse with DESIGN.md's error contract: one line on stderr, exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """Reports a bad flag as `error: ... (see PROG --help)` instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def optional_float(text: str) -> float | None:
    """A float, or none/0 for "off" (e.g. --clip_grad_norm none)."""
    if text.lower() in ("none", "off"):
        return None
    return float(text)
