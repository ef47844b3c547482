"""Imported at start-up by a Python whose PYTHONPATH holds this folder: sysconfig's include
path becomes $NO_HEADERS_DIR, an empty folder, as on a system Python without its -dev
package. inductor (its -I) and Triton (its launcher's build) both take Python.h from
there, so a real compile then fails as on such a machine (tests/train/test_compile.py)."""

import os
import sysconfig

_EMPTY = os.environ["NO_HEADERS_DIR"]
_get_path, _get_paths = sysconfig.get_path, sysconfig.get_paths


def _path(name, *args, **kwargs):
    return _EMPTY if name == "include" else _get_path(name, *args, **kwargs)


def _paths(*args, **kwargs):
    return {**_get_paths(*args, **kwargs), "include": _EMPTY}


sysconfig.get_path, sysconfig.get_paths = _path, _paths
