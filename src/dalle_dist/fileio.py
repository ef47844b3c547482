"""Writing files so that a crash never leaves one half-written (docs/design.md, "Errors"), and
keeping an optional engine's own output off our file descriptors."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from dalle_dist.errors import OutputError


def _default_file_mode() -> int:
    """What open() would give a new file: 0o666 less the umask (mkstemp uses 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; once the block has written it, it is fsynced
    and renamed over `path` (atomic on POSIX), and the directory fsynced so the rename
    survives a crash too. On failure the temporary file is removed. Missing parent
    directories are created here, at the first write, not before.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _default_file_mode())
        os.close(fd)
        yield Path(tmp)
        with open(tmp, "rb") as f:
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


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file that replaces `path` only once it is complete and on disk."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield f


def ensure_writable_dir(directory: str | Path, flag: str) -> Path:
    """Prove that files can be written in `directory`, creating nothing.

    Called before long work starts, so an unwritable output fails in seconds, not hours.
    A directory that does not exist yet is judged by its nearest existing ancestor, which
    is where it would be created.
    """
    directory = Path(directory)
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = f"{directory} is a file" if probe == directory else f"{probe} is a file"
        raise OutputError(f"cannot write to {directory} ({where}, not a folder)",
                          f"choose another location with {flag}")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise OutputError(
            f"cannot write to {directory} ({exc.strerror or exc})",
            f"choose a writable location with {flag}",
        ) from None
    return directory


def ensure_writable_file(path: str | Path, flag: str) -> Path:
    """Check that `path` can be (re)written: its folder is writable and it is not a folder."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a directory", f"give a file name with {flag}")
    ensure_writable_dir(path.parent, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{path} exists and is not writable", f"choose another {flag}")
    return path


@contextlib.contextmanager
def quiet_output() -> Iterator[None]:
    """Silence file descriptors 1 and 2 (DeepSpeed's loggers hold their own handles to
    them, so redirecting sys.stdout would not do), restoring them on the way out."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
