"""Writing files so that a crash never leaves one half-written (DESIGN.md, "Errors")."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from dalle_dist.errors import OutputError


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[bytes]]:
    """Yield a binary file that replaces `path` only once it is complete and on disk.

    The data goes to a temporary file in the same directory, is fsynced, then renamed over
    `path` (atomic on POSIX); the directory is fsynced so the rename survives a crash too.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(f)` on an atomic_writer for `path`."""
    with atomic_writer(path) as f:
        write(f)


def ensure_writable_dir(directory: str | Path, flag: str) -> Path:
    """Create `directory` if needed and prove a file can be written there.

    Called before long work starts, so an unwritable output fails in seconds, not hours.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise OutputError(
            f"cannot write to {directory} ({exc.strerror or exc})",
            f"choose a writable location with {flag}",
        ) from None
    return directory


def ensure_writable_file(path: str | Path, flag: str) -> Path:
    """Check that `path` can be (re)written: its directory is writable and it is not a folder."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a directory", f"give a file name with {flag}")
    ensure_writable_dir(path.parent if str(path.parent) else Path("."), flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{path} exists and is not writable", f"choose another {flag}")
    return path
