"""--amp's choice between NVIDIA Apex and native autocast, for the installs users meet.

NVIDIA Apex does not install here (not on PyPI, needs CUDA); each case below is a package
named `apex` written to disk and put first on sys.path, the way each install looks to
`from apex import amp`:

- the unrelated PyPI `apex` (a Pyramid toolkit): `import apex` itself fails, because its
  `__init__.py` starts by importing Pyramid packages that are not installed
  (cd34/apex, apex/__init__.py: `from pyramid_mailer.interfaces import IMailer`);
- NVIDIA Apex after amp's removal: the package imports, it has no `amp` submodule
  ("cannot import name 'amp'");
- NVIDIA Apex whose amp does not load (its C extension missing): `apex.amp` raises
  ImportError itself.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dalle_dist.backends.precision import apex_amp

CUDA = torch.device("cuda")

#: Files of each stand-in package, relative to the sys.path entry that holds it.
INSTALLS = {
    "unrelated-pypi-apex": {
        "apex/__init__.py": "from pyramid_mailer.interfaces import IMailer  # noqa\n",
        "apex/views.py": "def login(request):\n    return {}\n",
    },
    "apex-without-amp": {
        "apex/__init__.py": "",
        "apex/normalization/__init__.py": "class FusedLayerNorm:\n    pass\n",
        "apex/optimizers/__init__.py": "class FusedAdam:\n    pass\n",
    },
    "apex-amp-that-does-not-load": {
        "apex/__init__.py": "",
        "apex/amp/__init__.py":
            "raise ImportError('amp_C.so: cannot open shared object file')\n",
    },
}
#: What `from apex import amp` raises for each, so a stand-in that stopped failing the
#: way its install does (a typo in a file above) fails here instead of passing vacuously.
FAILURES = {
    "unrelated-pypi-apex": "No module named 'pyramid_mailer'",
    "apex-without-amp": "cannot import name 'amp' from 'apex'",
    "apex-amp-that-does-not-load": "amp_C.so",
}


def _forget_apex() -> dict[str, types.ModuleType]:
    names = [n for n in sys.modules if n == "apex" or n.startswith("apex.")]
    return {name: sys.modules.pop(name) for name in names}


@pytest.fixture
def fresh_apex() -> Iterator[None]:
    """No `apex` module imported before or during the test outlives it."""
    earlier = _forget_apex()
    yield
    _forget_apex()
    sys.modules.update(earlier)


def install(root: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    monkeypatch.syspath_prepend(str(root))


@pytest.mark.usefixtures("fresh_apex")
@pytest.mark.parametrize("package", list(INSTALLS))
def test_apex_without_amp_falls_back(package: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails if the probe lets any of these import failures escape (it must catch
    ImportError, not only ModuleNotFoundError, around the import of apex.amp itself), or
    if it reports a usable amp for them."""
    install(tmp_path, INSTALLS[package], monkeypatch)
    with pytest.raises(ImportError, match=FAILURES[package]):
        from apex import amp
    _forget_apex()  # the probe imports it afresh, as a new process would

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
