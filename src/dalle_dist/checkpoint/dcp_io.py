"""torch.distributed.checkpoint (DCP) read safely: no file of a sharded checkpoint runs code.

DCP writes tensors with torch.save and reads them back with torch.load(weights_only=True),
but it unpickles two things with plain pickle: the `.metadata` file (its own dataclasses,
torch.Size and dtypes) and every non-tensor value (the optimizer's param groups, as
`torch.load(weights_only=False)`). A checkpoint directory handed to `--resume` or
`dalle-dist checkpoint` is user input, so both are read here with an allow-list instead
(docs/design.md, "Checkpoints": pickled objects are refused unread):

- `SafeReader`: `.metadata` through an unpickler that accepts DCP's metadata classes and
  the few torch and builtin names they are made of, and refuses anything else;
- `SafeLoadPlanner` / `SafeWholeLoadPlanner`: non-tensor values through
  torch.load(weights_only=True).

Everything else (planning, resharding to another world size, the storage layout) is DCP's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from dalle_dist.errors import CheckpointError

#: Where a DCP `.metadata` pickle's own classes live: only its dataclasses and enums are
#: accepted from there, never a function.
DCP_MODULES = ("torch.distributed.checkpoint.",)
#: The other globals it is made of, checked by name: shapes, dtypes (below), layouts
#: (torch pickles `torch.strided` as a call of its name lookup), the checkpoint's path.
OTHER_GLOBALS = frozenset({
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
})
_DTYPES = frozenset(name for name, value in vars(torch).items() if isinstance(value, torch.dtype))


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in OTHER_GLOBALS or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        if module.startswith(DCP_MODULES):
            found = super().find_class(module, name)
            if isinstance(found, type) and (dataclasses.is_dataclass(found)
                                            or issubclass(found, enum.Enum)):
                return found
        raise pickle.UnpicklingError(f"Unsupported global: {module}.{name}")


class SafeReader(FileSystemReader):
    """DCP's file reader with `.metadata` read through the allow-list above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except FileNotFoundError:
            raise CheckpointError(f"{self.path} has no DCP .metadata: its save never "
                                  "finished", "use an earlier checkpoint") from None
        except pickle.UnpicklingError as exc:
            raise CheckpointError(f"{path} carries pickled Python objects ({exc}), refused "
                                  "unread (loading it could run arbitrary code)",
                                  "use a checkpoint written by dalle-dist") from None
        except (EOFError, ValueError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{path} is not a readable DCP metadata file "
                                  f"({type(exc).__name__})",
                                  "the file is truncated or corrupt; use an earlier "
                                  "checkpoint") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} is not DCP metadata",
                                  "use a checkpoint written by dalle-dist")
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeBytes:
    """load_bytes with torch.load(weights_only=True): plain values only (param groups)."""

    flatten_state_dict: bool
    mappings: dict[str, Any]
    original_state_dict: dict[str, Any]
    state_dict: dict[str, Any]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            found = [line for line in str(exc).splitlines() if "Unsupported global" in line]
            what = found[0].split("Unsupported global:")[1].split(" was not")[0].strip() if (
                found) else "not plain data"
            raise CheckpointError(f"a sharded checkpoint's value {read_item.dest_index.fqn} "
                                  f"carries pickled Python objects ({what}), refused unread "
                                  "(loading it could run arbitrary code)",
                                  "use a checkpoint written by dalle-dist") from None
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


class SafeLoadPlanner(_SafeBytes, DefaultLoadPlanner):
    """DCP's planner for loading into an existing (sharded) state dict."""


class SafeWholeLoadPlanner(_SafeBytes, _EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds whole tensors from the metadata (one process)."""


def read_metadata(directory: str | Path) -> Metadata:
    return SafeReader(str(directory)).read_metadata()


def tensor_shapes(metadata: Metadata, prefix: str) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Shape and dtype of every saved tensor under `prefix` ("model."), keyed without it:
    read from the metadata alone, no tensor data."""
    found = {}
    for key, value in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(value, TensorStorageMetadata):
            found[key.removeprefix(prefix)] = (value.size, value.properties.dtype)
    return found


def read_whole(directory: str | Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The checkpoint's state as whole CPU tensors in this process alone (no collective:
    safe inside a multi-rank job), optionally only the top-level `keys` ("model").
    It holds the whole state: for converting, verifying and sampling, not for training
    (a training rank loads its own shards: sharded_dir.load_into_engine)."""
    state: dict[str, Any] = {}
    with dcp_errors(f"{directory} could not be read as a sharded checkpoint",
                    "the files are truncated or corrupt; use an earlier checkpoint"):
        with one_process():
            _load_state_dict(state, storage_reader=SafeReader(str(directory)),
                             planner=SafeWholeLoadPlanner(keys=keys), no_dist=True)
    return state


@contextlib.contextmanager
def dcp_errors(what: str, fix: str) -> Iterator[None]:
    """Around a DCP load: a failure inside it becomes one CheckpointError, `what
    (reason)` with `fix`, or the CheckpointError one of ours raised in it (dcp_failure)."""
    try:
        yield
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:
        ours, reason = dcp_failure(exc)
        if ours is not None:
            raise ours from None
        raise CheckpointError(f"{what} ({reason})", fix) from None


def dcp_failure(exc: BaseException) -> tuple[CheckpointError | None, str]:
    """What failed inside DCP, which gathers each rank's exception into one
    CheckpointException (a BaseException): the CheckpointError one of ours raised there
    (a refused pickle), to re-raise as it is, else a one-line reason."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and failures:
        inner = [pair[0] for pair in failures.values()]
        for error in inner:
            if isinstance(error, CheckpointError):
                return error, ""
        exc = inner[0]
    return None, f"{type(exc).__name__}: {_first_line(exc)}"


@contextlib.contextmanager
def one_process() -> Iterator[None]:
    """DCP warns that it assumes one process when torch.distributed is not initialised:
    here that is the intent (convert, verify, generate), not news for the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
