"""Which checkpoint format a run writes (--checkpoint_format, --async_checkpoint), decided
from the flags and the backend before the model is built (docs/checkpoints.md).

- `full`: one file, `NAME.pt`, gathered on rank 0 (checkpoint/single_file.py);
- `sharded`: `NAME-sharded/`, each rank's own shards through DCP (checkpoint/sharded_dir.py);
- `native`: DeepSpeed's own directory `NAME-ds-cp/` (checkpoint/deepspeed_dir.py), its
  sharded format: what `sharded` means under --deepspeed.
"""

from __future__ import annotations

from dalle_dist.backends import DistributedBackend
from dalle_dist.errors import ConfigError

FULL, SHARDED, NATIVE = "full", "sharded", "native"
#: What --checkpoint_format accepts (native is what sharded means under DeepSpeed).
CHOICES = (FULL, SHARDED)


def resolve_format(requested: str | None, backend: type[DistributedBackend] | DistributedBackend,
                   asynchronous: bool = False) -> str:
    """The format a run on `backend` writes: `requested` (None: the backend's default),
    checked; a ConfigError names the fix when the backend cannot write it."""
    if requested is not None and requested not in CHOICES:
        raise ConfigError(f"--checkpoint_format {requested} is not a format",
                          f"choose one of {', '.join(CHOICES)}")
    if backend.has_native_checkpoint:
        if requested == FULL:
            raise ConfigError(
                f"--checkpoint_format full: backend {backend.name} keeps its optimizer "
                "partitions in its own directory NAME-ds-cp/, its sharded format",
                "leave --checkpoint_format out; dalle-dist checkpoint convert NAME-ds-cp "
                "OUT.pt makes a single file from it")
        if asynchronous:
            raise ConfigError(f"--async_checkpoint writes DCP sharded checkpoints; backend "
                              f"{backend.name} writes its own directory",
                              "leave --async_checkpoint out")
        return NATIVE
    chosen = requested or backend.default_checkpoint_format
    if chosen == SHARDED and not backend.saves_sharded:
        raise ConfigError(f"--checkpoint_format sharded needs a torch.distributed process "
                          f"group, which backend {backend.name} does not start",
                          "use --checkpoint_format full, or --distributed_backend fsdp or "
                          "torch")
    if asynchronous and chosen != SHARDED:
        raise ConfigError("--async_checkpoint writes sharded checkpoints in the background; "
                          f"this run writes the {chosen} format (one file, gathered on "
                          "rank 0)", "add --checkpoint_format sharded")
    return chosen
