"""Exceptions that carry a message written for the user.

Library code raises these; only the CLI turns them into `error: ...` and exit status 2
(docs/design.md, "Errors"). Anything else that escapes is a bug in dalle_dist and keeps its
traceback.
"""

from __future__ import annotations


class DalleDistError(Exception):
    """A user's mistake: the message says what is wrong and, in brackets, what to do."""

    #: The process's exit status when this error ends a command.
    exit_status: int = 2

    def __init__(self, what: str, fix: str | None = None) -> None:
        self.what = what
        self.fix = fix
        super().__init__(f"{what} ({fix})" if fix else what)


class ConfigError(DalleDistError):
    """A flag value, or a combination of flags, that cannot work."""


class DataError(DalleDistError):
    """A dataset that is missing, empty or unreadable, or a caption that does not fit."""


class CheckpointError(DalleDistError):
    """A checkpoint that is missing, corrupt, unsafe, or of the wrong kind."""


class OutputError(DalleDistError):
    """An output path that cannot be written."""


class PeerLost(DalleDistError):
    """A wait for the other ranks failed or ran past --collective_timeout: a rank died, hung
    or took another path. Not the user's mistake, so its own exit status (3)."""

    exit_status = 3


class Stopped(Exception):
    """Training was asked to stop (SIGTERM or SIGINT) and saved a resumable checkpoint."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
