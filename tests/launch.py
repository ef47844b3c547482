"""The one way tests start several ranks: torchrun, the deepspeed launcher, horovodrun, or
bare processes given a launcher's environment. Every call has a timeout, so a hang fails
the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

BIN = Path(sys.executable).parent
#: Launchers start processes that each import torch (and DeepSpeed): give them time.
LAUNCH_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(env: dict[str, str] | None) -> dict[str, str]:
    # One thread per rank: two ranks share this machine's two cores.
    return {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}


def _run(cmd: Sequence[str], cwd: Path | None, env: dict[str, str] | None,
         timeout: float) -> subprocess.CompletedProcess[str]:
    """The launcher in its own session: on a timeout the whole group is killed, ranks
    included (killing the launcher alone leaves them running, holding ports and cores)."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def torchrun(*args: str, nproc: int = 2, cwd: Path | None = None,
             env: dict[str, str] | None = None, timeout: float = LAUNCH_TIMEOUT,
             launcher_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "torchrun"), "--nproc_per_node", str(nproc),
           "--master_port", str(free_port()), *launcher_args, "-m", "dalle_dist", *args]
    return _run(cmd, cwd, env, timeout)


def deepspeed(*args: str, nproc: int = 2, cwd: Path | None = None,
              env: dict[str, str] | None = None,
              timeout: float = LAUNCH_TIMEOUT) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port",
           str(free_port()), "--module", "dalle_dist", *args]
    return _run(cmd, cwd, env, timeout)


def horovodrun(*args: str, nproc: int = 2, cwd: Path | None = None,
               env: dict[str, str] | None = None,
               timeout: float = LAUNCH_TIMEOUT) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "horovodrun"), "-np", str(nproc), "--gloo", sys.executable, "-m",
           "dalle_dist", *args]
    return _run(cmd, cwd, env, timeout)


def bare_ranks(*args: str, world: int = 2, cwd: Path | None = None,
               env: dict[str, str] | None = None, timeout: float = 120,
               ) -> list[subprocess.CompletedProcess[str]]:
    """`world` plain `python -m dalle_dist` processes with torchrun's variables set.

    Without a launcher in between, each rank's exit status and stderr are its own:
    this is how the per-rank error contract is checked.
    """
    port = str(free_port())
    procs = []
    for rank in range(world):
        rank_env = _env({**(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank),
                         "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        procs.append(subprocess.Popen([sys.executable, "-m", "dalle_dist", *args], cwd=cwd,
                                      env=rank_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return _wait_all(procs, timeout)


def _wait_all(procs: list[subprocess.Popen[str]], timeout: float
              ) -> list[subprocess.CompletedProcess[str]]:
    """Collect every process; on a timeout kill them all, so no rank outlives the test."""
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def torchrun_nodes(*args: str, nodes: int = 2, cwd: Path | None = None,
                   env: dict[str, str] | None = None, timeout: float = LAUNCH_TIMEOUT,
                   ) -> list[subprocess.CompletedProcess[str]]:
    """`nodes` torchrun launchers, one process each, meeting at a c10d rendezvous on
    127.0.0.1: the multi-node launch line, with this machine playing every node."""
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [str(BIN / "torchrun"), "--nnodes", str(nodes), "--nproc_per_node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "dalle-test",
           "-m", "dalle_dist", *args]
    procs = [subprocess.Popen(cmd, cwd=cwd, env=_env(env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(nodes)]
    return _wait_all(procs, timeout)
