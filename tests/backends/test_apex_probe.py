"""--amp's choice between NVIDIA Apex and native autocast, for the installs users meet.

NVIDIA Apex does not install here (not on PyPI, needs CUDA); these stand-in packages are
what the probe would see: the unrelated PyPI `apex`, and an Apex without `amp`.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from dalle_dist.backends.precision import apex_amp

CUDA = torch.device("cuda")


@pytest.mark.parametrize("package", ["unrelated-pypi-apex", "apex-without-amp"])
def test_apex_without_amp_falls_back(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("apex")
    fake.__path__ = []  # a package, so "from apex import amp" looks for a submodule
    monkeypatch.setitem(sys.modules, "apex", fake)
    monkeypatch.delitem(sys.modules, "apex.amp", raising=False)
    amp, why = apex_amp(CUDA)
    assert amp is None
    assert "apex.amp is not importable" in why and "PyPI package named apex is unrelated" in why


def test_real_apex_amp_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("apex")
    fake.amp = types.ModuleType("apex.amp")
    monkeypatch.setitem(sys.modules, "apex", fake)
    monkeypatch.setitem(sys.modules, "apex.amp", fake.amp)
    amp, why = apex_amp(CUDA)
    assert amp is fake.amp and why == ""


def test_cpu_never_uses_apex() -> None:
    amp, why = apex_amp(torch.device("cpu"))
    assert amp is None and "needs CUDA" in why
