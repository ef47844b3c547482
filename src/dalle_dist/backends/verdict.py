"""Whether a backend or a precision can run here, asked without running anything.

Each backend class answers for itself (`DistributedBackend.verdict`), each precision
likewise (`PrecisionKind.verdict`); `dalle-dist check` prints the answers and `train`
stops on them before anything launches. Probing only imports and asks: no probe raises,
a broken engine is a fact to report.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    usable: bool
    reason: str = ""
    fix: str = ""

    def text(self) -> str:
        if self.usable:
            return "usable" + (f" ({self.reason})" if self.reason else "")
        return f"not usable: {self.reason}" + (f" (fix: {self.fix})" if self.fix else "")


def installed_version(distribution: str) -> str | None:
    """The installed version of a pip distribution, None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message`, for a verdict's reason."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
