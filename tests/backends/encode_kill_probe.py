"""`python -m tests.backends.encode_kill_probe ARGS` runs `python -m dalle_dist ARGS`, and
kills its own process with SIGKILL, as a node failure or the OOM killer would, half-way
through writing token shard number $KILL_AT_SHARD (1: the first): the shard's temporary
file is left with half its bytes, never renamed into place. Nothing else changes.
tests/backends/test_token_shards.py launches it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any


def install(at_shard: int) -> None:
    import safetensors.torch

    save_file = safetensors.torch.save_file
    calls = {"n": 0}

    def save_or_die(tensors: Any, filename: str, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        result = save_file(tensors, filename, *args, **kwargs)
        if calls["n"] == at_shard:
            path = Path(filename)
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            print(f"kill probe: killed while writing shard {at_shard}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    safetensors.torch.save_file = save_or_die


def main() -> int:
    install(int(os.environ["KILL_AT_SHARD"]))
    from dalle_dist.cli import main as dalle_main

    return dalle_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
