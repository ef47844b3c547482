"""Rank processes for the training and resume checks, started the way a user starts them.

Each backend runs under its own launcher (`deepspeed`, `torchrun`, `horovodrun`, or plain
Python for `single`), with world size 1 or, for the multi-GPU checks, one rank per GPU, and
each rank runs `python -m dalle_dist.selftest.worker`:
the installed package, found as any installed module is, never a file path into a
checkout or a PYTHONPATH pointing at one. A selftest that ran other code than the
user's `dalle-dist` would prove nothing about it.

One process runs a whole group of specs (the launcher's start-up, seconds on a GPU
machine, is paid once per group); the worker writes one JSON result per spec.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The console scripts of the Python that runs the selftest (its venv's bin/).
BIN = Path(sys.executable).parent
WORKER_MODULE = "dalle_dist.selftest.worker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment for the launched ranks, plus `extra`; torch extensions
    (DeepSpeed's CPU ops, built on first use) in this venv's own folder where it is
    writable, so a venv builds them once and no two venvs' builds mix in ~/.cache
    (tests/conftest.py says why)."""
    env = {**os.environ, **(extra or {})}
    if os.access(sys.prefix, os.W_OK):  # not in the Docker image's system Python
        env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    return env


def launch_line(backend: str, nproc: int = 1) -> list[str]:
    """How a user starts `nproc` ranks of `backend` on this machine with its own launcher,
    up to the module to run."""
    if backend == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port",
                str(free_port()), "--module"]
    if backend in ("fsdp", "torch"):
        return [str(BIN / "torchrun"), "--nproc_per_node", str(nproc), "--master_port",
                str(free_port()), "-m"]
    if backend == "horovod":
        return [str(BIN / "horovodrun"), "-np", str(nproc), "-H", f"localhost:{nproc}",
                "--gloo", sys.executable, "-m"]
    return [sys.executable, "-m"]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children first read from /proc (Linux; elsewhere none,
    and the caller's session kill is all there is)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Launch:
    """A finished (or killed) launch: its output lines with the monotonic time each
    arrived, and how it ended."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    note: str = ""

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def launch(cmd: list[str], folder: Path, timeout: float, env: dict[str, str] | None = None,
           until: Callable[[str], bool] | None = None) -> Launch:
    """Run `cmd` in its own session, stamping each output line as it arrives; kill the
    whole session (the launcher and its ranks) at `timeout` seconds, or as soon as a line
    satisfies `until` (the hung-peer check stops there: a launcher may wait half a
    minute more before it kills a stopped rank)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=rank_env(env), start_new_session=True, cwd=folder)
    result = Launch()
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            result.lines.append((time.monotonic(), line.rstrip("\n")))
            if until is not None and until(line):
                seen.set()
        seen.set()  # end of output: the launcher ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ended = seen.wait(timeout)
    if proc.poll() is None:
        # the launcher's session and every process under it: torchrun starts each rank in
        # a session of its own, which killing the launcher's would leave running
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(10)
    result.note = (f"exit status {proc.returncode}" if ended else
                   f"timed out after {timeout:.0f} s")
    return result


def run_specs(backend: str, specs: list[dict[str, Any]], folder: Path, timeout: float,
              env: dict[str, str] | None = None, nproc: int = 1) -> list[dict[str, Any]]:
    """Run the specs in `nproc` rank processes of `backend`; their results, in order (rank
    0's; a spec whose process died or timed out gets the launch's output tail as its
    error)."""
    for i, spec in enumerate(specs):
        spec["result"] = str(folder / f"result-{backend}-{i}-{time.monotonic_ns()}.json")
    spec_file = folder / f"specs-{backend}-{time.monotonic_ns()}.json"
    spec_file.write_text(json.dumps(specs))
    done = launch([*launch_line(backend, nproc), WORKER_MODULE, str(spec_file)], folder,
                  timeout, env)
    results = []
    for spec in specs:
        path = Path(spec["result"])
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({"ok": False, "error": f"no result ({done.note}): "
                            f"{done.text[-1500:]}"})
    return results
