"""`python -m tests.backends.crash_probe ARGS` runs `python -m dalle_dist ARGS`, and kills
its own process with SIGKILL, as a node failure or the OOM killer would, when rank
$CRASH_RANK starts writing its shards of DCP save number $CRASH_AT_SAVE (1: the first)
through torch's FileSystemWriter. With --async_checkpoint that is in the background
thread, while the step loop goes on: the kill lands mid-way through an asynchronous save.
Nothing else changes. tests/backends/test_sharded_checkpoints.py launches it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def install(rank: int, at_save: int) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    write = FileSystemWriter.write_data
    calls = {"n": 0}

    def write_or_die(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == at_save and int(os.environ.get("RANK", "0")) == rank:
            print(f"crash probe: rank {rank} killed while writing save {at_save}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return write(self, *args, **kwargs)

    FileSystemWriter.write_data = write_or_die  # type: ignore[method-assign]


def main() -> int:
    install(int(os.environ["CRASH_RANK"]), int(os.environ["CRASH_AT_SAVE"]))
    from dalle_dist.cli import main as dalle_main

    return dalle_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
