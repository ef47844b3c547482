"""What torch.compile's inductor needs on this machine to build its kernels.

Inductor writes code and compiles it while the run goes on. On CPU it builds C++ with a
C++ compiler ($CXX, else g++) into a Python extension, which includes Python.h. On CUDA it
writes Triton kernels, and Triton builds its launcher with a C compiler ($CC, else gcc or
clang), against Python.h too. A machine without one of them (a slim or runtime container,
a system Python without its -dev package) fails at the first compiled call, minutes into
a run, with a traceback that names a temporary file: "fatal error: Python.h: No such file
or directory", "Failed to find C compiler", "No working C++ compiler found".

Three things compile that way: `train --compile`, `generate --compile`, and FlexAttention,
which `--attn_impl auto` takes on CUDA for every pattern but full attention (model/
attention.py resolve_impl). Each asks `require_toolchain` before anything launches, and
`dalle-dist check` prints `inductor_toolchain` for this machine's device. Probing runs
the compilers' own lookups only; it compiles nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dalle_dist.errors import ConfigError

#: What to install for each missing part, by the part's key in Toolchain.missing.
FIXES: dict[str, str] = {
    "cxx": "install a C++ compiler (apt-get install g++) or point CXX at one",
    "cc": "install a C compiler (apt-get install gcc) or point CC at one",
    "headers": (f"install this Python's headers (apt-get install "
                f"python{sys.version_info.major}.{sys.version_info.minor}-dev, or "
                "python3-dev; a conda or pyenv Python carries them)"),
    "triton": "pip install the triton release this torch names (pip show torch: Requires)",
}
#: Each part as a sentence names it.
PARTS: dict[str, str] = {"cxx": "a C++ compiler", "cc": "a C compiler for Triton",
                         "headers": "Python's headers", "triton": "Triton"}


@dataclass(frozen=True)
class Toolchain:
    """inductor's build tools for one device type, as found on this machine."""

    device: str                  # "cpu" | "cuda"
    compiler: str | None         # the C++ (cpu) or C (cuda, Triton's launcher) compiler
    python_headers: str | None   # the directory that holds Python.h
    triton: str | None           # Triton's version (cuda only)
    missing: tuple[tuple[str, str], ...]  # (part, what is wrong), in FIXES' keys

    @property
    def ready(self) -> bool:
        return not self.missing

    def needs(self) -> str:
        """'a C compiler and Python's headers': the missing parts, for a sentence."""
        parts = [PARTS[part] for part, _ in self.missing]
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"

    def details(self) -> str:
        return "; ".join(why for _, why in self.missing)

    def fix(self) -> str:
        return "; ".join(FIXES[part] for part, _ in self.missing)

    def as_dict(self) -> dict[str, Any]:
        """For reports (`check --json`'s `compile`, the selftest's environment): the tools
        found, what is wrong per missing part, and the sentence parts (None when ready)."""
        return {"device": self.device, "ready": self.ready, "compiler": self.compiler,
                "python_headers": self.python_headers, "triton": self.triton,
                "missing": [why for _, why in self.missing],
                "needs": self.needs() if self.missing else None,
                "fix": self.fix() if self.missing else None}


def python_headers() -> str | None:
    """The include directory holding Python.h, where inductor and Triton look (the install
    scheme's, and posix_prefix's, which Triton uses on Debian's posix_local); None if it
    is in none of them."""
    dirs = [sysconfig.get_path("include")]
    if os.name == "posix":
        dirs.append(sysconfig.get_path("include", scheme="posix_prefix"))
    return next((d for d in dirs if d and (Path(d) / "Python.h").is_file()), None)


def _cpp_compiler() -> tuple[str | None, str | None]:
    """(inductor's C++ compiler, None) or (None, why there is none): inductor's own search
    ($CXX, else g++), which runs `<compiler> --version`."""
    from torch._inductor import cpp_builder

    try:
        return cpp_builder.get_cpp_compiler(), None
    except Exception as error:  # inductor's InvalidCxxCompiler, or a failed probe
        return None, str(error).strip().splitlines()[0]


def _c_compiler() -> tuple[str | None, str | None]:
    """(the C compiler Triton builds its launcher with, None) or (None, why there is none):
    Triton's own rule, $CC if set, else gcc, else clang on PATH."""
    named = os.environ.get("CC")
    if named:
        words = shlex.split(named)
        found = shutil.which(words[0]) if words else None
        return (found, None) if found else (None, f"$CC={named} is not a program here")
    found = shutil.which("gcc") or shutil.which("clang")
    return (found, None) if found else (None, "no $CC, and neither gcc nor clang is on PATH")


def _triton() -> tuple[str | None, str | None]:
    try:
        import triton
    except ModuleNotFoundError:
        return None, "Triton is not installed"
    except Exception as error:  # a build for another torch or CUDA
        return None, f"import triton fails: {str(error).strip().splitlines()[0]}"
    return str(getattr(triton, "__version__", "unknown")), None


def inductor_toolchain(device_type: str) -> Toolchain:
    """What inductor needs to build kernels for `device_type` ("cpu" or "cuda") here, and
    which of it is missing; every part is looked for, so one message names them all."""
    missing: list[tuple[str, str]] = []
    triton = None
    if device_type == "cuda":
        triton, why = _triton()
        if why:
            missing.append(("triton", why))
        compiler, why = _c_compiler()
        if why:
            missing.append(("cc", why))
    else:
        compiler, why = _cpp_compiler()
        if why:
            missing.append(("cxx", why))
    headers = python_headers()
    if headers is None:
        missing.append(("headers", f"no Python.h in {sysconfig.get_path('include')}"))
    return Toolchain(device_type, compiler, headers, triton, tuple(missing))


def require_toolchain(device_type: str, what: str, alternative: str) -> None:
    """Refuse `what` (e.g. "--compile: inductor") before the run, in one line, where
    inductor cannot build kernels for `device_type`; `alternative` is the flag choice that
    needs no compile, given after the fixes."""
    toolchain = inductor_toolchain(device_type)
    if toolchain.ready:
        return
    raise ConfigError(f"{what} needs {toolchain.needs()} on {device_type.upper()}: "
                      f"{toolchain.details()}", f"{toolchain.fix()}; or {alternative}")
