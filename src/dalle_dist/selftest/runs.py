"""Rank processes for the training and resume checks, started the way a user starts them.

Each backend runs under its own launcher (`deepspeed`, `torchrun`, or plain Python for
`single`), with world size 1, and the rank runs `python -m dalle_dist.selftest.worker`:
the installed package, found as any installed module is, never a file path into a
checkout or a PYTHONPATH pointing at one. A selftest that ran other code than the
user's `dalle-dist` would prove nothing about it.

One process runs a whole group of specs (the launcher's start-up, seconds on a GPU
machine, is paid once per group); the worker writes one JSON result per spec.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
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


def launch_line(backend: str) -> list[str]:
    """How a user starts one rank of `backend` (its own launcher, world size 1), up to the
    module to run."""
    if backend == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", "1", "--master_port", str(free_port()),
                "--module"]
    if backend in ("fsdp", "torch"):
        return [str(BIN / "torchrun"), "--nproc_per_node", "1", "--master_port",
                str(free_port()), "-m"]
    return [sys.executable, "-m"]


def run_specs(backend: str, specs: list[dict[str, Any]], folder: Path, timeout: float,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the specs in one rank process of `backend`; their results, in order (a spec
    whose process died or timed out gets the process's output tail as its error)."""
    for i, spec in enumerate(specs):
        spec["result"] = str(folder / f"result-{backend}-{i}-{time.monotonic_ns()}.json")
    spec_file = folder / f"specs-{backend}-{time.monotonic_ns()}.json"
    spec_file.write_text(json.dumps(specs))
    proc = subprocess.Popen([*launch_line(backend), WORKER_MODULE, str(spec_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=rank_env(env), start_new_session=True, cwd=folder)
    try:
        output, _ = proc.communicate(timeout=timeout)
        note = f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks
        output, _ = proc.communicate()
        note = f"timed out after {timeout:.0f} s"
    results = []
    for spec in specs:
        path = Path(spec["result"])
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({"ok": False, "error": f"no result ({note}): "
                            f"{(output or '')[-1500:]}"})
    return results
