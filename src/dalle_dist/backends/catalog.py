"""Which backends exist, by name, without importing any of them.

Parsers (`--distributed_backend`'s help, `dalle-dist check --backend`) need the names
before torch is imported; the registry imports each module named here, and each module's
backend class registers itself under its name (contract.DistributedBackend). The order
is the one `check`, `--help` and errors list them in: simplest first, the first is the
default.
"""

from __future__ import annotations

#: backend name -> its module in dalle_dist.backends
BACKEND_MODULES: dict[str, str] = {
    "single": "single",
    "torch": "torch_ddp",
    "fsdp": "fsdp",
    "deepspeed": "deepspeed",
    "horovod": "horovod",
}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKEND_MODULES)
DEFAULT_BACKEND = BACKEND_NAMES[0]
