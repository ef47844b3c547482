"""How a rank of a multi-process run ends: at once, with everything flushed."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from dalle_dist.errors import DalleDistError


def exit_now(status: int) -> NoReturn:
    """End a rank of a multi-process run without running C++ static destructors.

    A rank that has written everything and left its process group can still abort while
    the interpreter tears torch's native state down ("terminate called without an active
    exception", SIGABRT, no Python frame): seen often on CPU runs of FSDP and ZeRO-3 VAE
    training with sample grids, after the checkpoint was complete (docs/benchmarks.md). The
    launcher then reports the whole job failed, and an error's exit status 2 would
    turn into a signal. Output is flushed first; files are already fsynced.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def report_and_exit(error: DalleDistError) -> NoReturn:
    """The watchdog's end of a rank (backends/watch.py): its main thread is blocked inside
    the engine and cannot raise, so the error line is printed from here. The line starts
    on a line of its own: a progress bar may be half drawn on stderr."""
    sys.stderr.write(f"\nerror: {error}\n")
    exit_now(error.exit_status)
