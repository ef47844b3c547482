"""A user error raised on one rank, shipped to the others as plain data and raised there.

What lets every rank take the same path when one of them fails (DistributedBackend's
on_root and everywhere; docs/design.md, "No silent hangs" and "Errors"): the error travels
as (class name, message, exit status), never pickled as an exception object.
"""

from __future__ import annotations

from dalle_dist.errors import DalleDistError, Stopped

#: An error as it travels between ranks: (class name, message, exit status).
PortableError = tuple[str, str, int]


def portable(exc: DalleDistError | Stopped) -> PortableError:
    """An error as plain data (class name, message, exit status), to send to other ranks."""
    return type(exc).__name__, str(exc), getattr(exc, "exit_status", 0)


def rebuilt(error: PortableError, rank: int | None, quiet: bool = False
            ) -> DalleDistError | Stopped:
    """The error again; a stop's message is the root's alone to print (quiet elsewhere)."""
    kind, message, status = error
    if kind == "Stopped":
        return Stopped("" if quiet else message)
    error_again = DalleDistError(f"rank {rank}: {message}" if rank is not None else message)
    error_again.exit_status = status
    return error_again
