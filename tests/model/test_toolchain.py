"""model/toolchain.py: what torch.compile's inductor needs to build kernels here, found or
named missing, and the CUDA runs that need it (FlexAttention) refused before they start.

A missing part is made real where the environment can make it so ($CC, $PATH); Python.h
is hidden by pointing sysconfig's include path, which inductor and Triton both read, at an
empty folder (tests/train/test_compile.py does the same to a whole `train --compile` run;
tests/diagnose/logs/other__captured-train-compile-no-python-headers.log is such a run
without the check, failing at its first compiled step).
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from dalle_dist.errors import ConfigError
from dalle_dist.model.kernels import check_flex_toolchain, flex_patterns
from dalle_dist.model.patterns import PATTERNS
from dalle_dist.model.toolchain import inductor_toolchain, require_toolchain

CUDA = torch.device("cuda")  # only named: nothing here touches a GPU


def parts(device_type: str) -> dict[str, str]:
    return dict(inductor_toolchain(device_type).missing)


def test_this_machine_builds_cpu_kernels() -> None:
    """The suite compiles with inductor elsewhere, so this machine has both tools; the
    probe must find the very files (bug: a probe looking in the wrong folder reports a
    working machine as broken, and every --compile run is refused)."""
    toolchain = inductor_toolchain("cpu")
    assert toolchain.ready, toolchain.missing
    assert shutil.which(toolchain.compiler or ""), toolchain.compiler
    assert (Path(toolchain.python_headers or "") / "Python.h").is_file()


def test_missing_python_headers_are_named_with_the_package_to_install(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Bug: a check of the compiler alone lets a run without Python.h start and fail at
    its first compiled call ("fatal error: Python.h: No such file or directory")."""
    get_path = sysconfig.get_path
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *args, **kwargs: (
        str(tmp_path) if name == "include" else get_path(name, *args, **kwargs)))
    assert parts("cpu") == {"headers": f"no Python.h in {tmp_path}"}
    report = inductor_toolchain("cpu").as_dict()  # check --json's `compile`, the selftest's
    assert (report["ready"], report["python_headers"], report["needs"]) == (
        False, None, "Python's headers"), report
    assert report["missing"] == [f"no Python.h in {tmp_path}"] and "-dev" in report["fix"]
    assert set(parts("cuda")) >= {"headers"}
    with pytest.raises(ConfigError) as raised:
        require_toolchain("cpu", "--compile: inductor", "use --compile_backend aot_eager")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}-dev"
    assert str(raised.value).startswith(
        f"--compile: inductor needs Python's headers on CPU: no Python.h in {tmp_path} ("
    ), raised.value
    assert version in str(raised.value) and "or use --compile_backend aot_eager)" in str(
        raised.value)


def test_tritons_c_compiler_is_looked_for_as_triton_does(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Triton builds its launcher with $CC, else gcc, else clang. Bugs: $CC trusted
    without looking it up; a PATH without either compiler passed; a $CC with flags
    ("ccache gcc", "gcc -O2") refused."""
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    assert parts("cuda")["cc"] == f"$CC={tmp_path / 'no-cc'} is not a program here"
    monkeypatch.delenv("CC")
    path = str(Path(shutil.which("gcc") or "/usr/bin/gcc").parent)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert parts("cuda")["cc"] == "no $CC, and neither gcc nor clang is on PATH"
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("CC", "gcc -O2")
    assert "cc" not in parts("cuda")


@pytest.mark.parametrize(("attn_impl", "expected"), [
    ("auto", ["axial_row", "axial_col", "conv_like", "sparse"]),
    ("flex", list(PATTERNS)),
    ("matmul", ["sparse"]),  # no band to multiply: sparse falls back to auto's choice
    ("gather", []),
    ("sdpa", []),
], ids=lambda value: value if isinstance(value, str) else None)
def test_the_patterns_that_take_flex_on_cuda(attn_impl: str, expected: list[str]) -> None:
    """resolve_impl's choice on CUDA for layers without dropout (validation, sampling).
    Bug: asking with the CPU or with a training dropout finds no flex and checks nothing."""
    assert flex_patterns(tuple(PATTERNS), attn_impl) == expected


def test_a_cuda_run_whose_flex_cannot_compile_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With Triton's C compiler missing, a CUDA run with band patterns stops before it
    starts, naming them and the path that compiles nothing; full attention alone, an
    explicit non-flex path and the CPU need no compiler and pass."""
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    with pytest.raises(ConfigError) as raised:
        check_flex_toolchain(("full", "axial_row", "conv_like", "axial_row"), "auto", CUDA)
    text = str(raised.value)
    assert text.startswith("FlexAttention (--attn_impl auto, for axial_row, conv_like) needs "
                           ), text
    assert "a C compiler for Triton on CUDA" in text and "$CC=" in text, text
    assert text.endswith("or --attn_impl gather, which compiles nothing)"), text
    check_flex_toolchain(("full",), "auto", CUDA)
    check_flex_toolchain(("axial_row", "conv_like"), "gather", CUDA)
    check_flex_toolchain(("axial_row",), "auto", torch.device("cpu"))
