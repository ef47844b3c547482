"""The one way tests start several ranks: torchrun, the deepspeed launcher, horovodrun, or
bare processes given a launcher's environment. Every call has a timeout, so a hang fails
the test instead of stalling the suite.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent
#: Launchers start processes that each import torch (and DeepSpeed): give them time.
LAUNCH_TIMEOUT = 300


#: The ports handed to launchers come from below Linux's ephemeral range (32768-60999),
#: which the kernel gives to outgoing connections and to bind(0): a port picked there can
#: be taken by anyone before the launcher binds it. Each pytest-xdist worker counts through
#: a block of its own (a run without xdist takes the last), from a random start, so two
#: workers never name the same port and two test runs side by side seldom do; a port that
#: is bound at the moment is skipped.
PORT_BASE, PORT_BLOCK, PORT_BLOCKS = 20000, 1000, 12


def _port_block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else -1
    return PORT_BASE + (index % PORT_BLOCKS) * PORT_BLOCK


_next_ports = itertools.count(random.randrange(PORT_BLOCK))


def free_port() -> int:
    """A port no process on this machine is bound to, for a launcher's rendezvous."""
    block = _port_block()
    for _ in range(PORT_BLOCK):
        port = block + next(_next_ports) % PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {block}-{block + PORT_BLOCK - 1}")


def _env(env: dict[str, str] | None) -> dict[str, str]:
    # One thread per rank: two ranks share this machine's two cores.
    return {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}


def command(launcher: str, *args: str, nproc: int = 2,
            launcher_args: Sequence[str] = (), module: str = "dalle_dist") -> list[str]:
    """The launch line of `launcher` (torchrun, deepspeed or horovodrun) for
    `python -m MODULE ARGS` on `nproc` local ranks (MODULE: dalle_dist, or a test's
    wrapper of it)."""
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), "--nproc_per_node", str(nproc),
                "--master_port", str(free_port()), *launcher_args, "-m", module, *args]
    if launcher == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port",
                str(free_port()), *launcher_args, "--module", module, *args]
    if launcher == "horovodrun":
        return [str(BIN / "horovodrun"), "-np", str(nproc), "--gloo", *launcher_args,
                sys.executable, "-m", module, *args]
    raise ValueError(launcher)


def start(cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
          stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """A launcher in its own session, so that finish() can end it with all its ranks."""
    return subprocess.Popen(list(cmd), cwd=cwd, env=_env(env), stdout=subprocess.PIPE,
                            stderr=stderr, text=True, start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Wait for a started launcher; on a timeout kill the whole group, ranks included
    (killing the launcher alone leaves them running, holding ports and cores)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")


def rank_processes(proc: subprocess.Popen[str]) -> dict[int, psutil.Process]:
    """The launcher's rank processes (`python -m dalle_dist ...`) by global rank."""
    ranks = {}
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmdline, env = child.cmdline(), child.environ()
        except psutil.NoSuchProcess:
            continue
        if any(a == "-m" and b == "dalle_dist" for a, b in itertools.pairwise(cmdline)):
            rank = env.get("HOROVOD_RANK", env.get("RANK"))
            if rank is not None:
                ranks[int(rank)] = child
    return ranks


def _run(cmd: Sequence[str], cwd: Path | None, env: dict[str, str] | None,
         timeout: float) -> subprocess.CompletedProcess[str]:
    return finish(start(cmd, cwd, env), timeout)


def torchrun(*args: str, nproc: int = 2, cwd: Path | None = None,
             env: dict[str, str] | None = None, timeout: float = LAUNCH_TIMEOUT,
             launcher_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return _run(command("torchrun", *args, nproc=nproc, launcher_args=launcher_args), cwd,
                env, timeout)


def deepspeed(*args: str, nproc: int = 2, cwd: Path | None = None,
              env: dict[str, str] | None = None,
              timeout: float = LAUNCH_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return _run(command("deepspeed", *args, nproc=nproc), cwd, env, timeout)


def horovodrun(*args: str, nproc: int = 2, cwd: Path | None = None,
               env: dict[str, str] | None = None,
               timeout: float = LAUNCH_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return _run(command("horovodrun", *args, nproc=nproc), cwd, env, timeout)


def bare_ranks(*args: str, world: int = 2, cwd: Path | Sequence[Path] | None = None,
               env: dict[str, str] | None = None, timeout: float = 120,
               ) -> list[subprocess.CompletedProcess[str]]:
    """`world` plain `python -m dalle_dist` processes with torchrun's variables set.

    Without a launcher in between, each rank's exit status and stderr are its own:
    this is how the per-rank error contract is checked. `cwd` may give each rank its own
    folder, as if each were on a node of its own with files the others do not see.
    """
    port = str(free_port())
    cwds = list(cwd) if isinstance(cwd, list | tuple) else [cwd] * world
    procs = []
    for rank in range(world):
        rank_env = _env({**(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank),
                         "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        procs.append(subprocess.Popen([sys.executable, "-m", "dalle_dist", *args],
                                      cwd=cwds[rank], env=rank_env, stdout=subprocess.PIPE,
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


def logged_steps(metrics: Path) -> list[int]:
    """The steps of a run's metrics lines, in the order written (a resumed run appends).

    Only whole lines count: read while the run appends, the file can end in part of a line
    (a CI run read '{"time": 4' and failed on it)."""
    if not metrics.exists():
        return []
    whole = metrics.read_text().split("\n")[:-1]
    return [json.loads(line)["step"] for line in whole if line.strip()]


def logged_step(metrics: Path) -> int:
    return max(logged_steps(metrics), default=0)


def wait_for_step(proc: subprocess.Popen[str], metrics: Path, step: int,
                  timeout: float = 180, after_line: int = 0) -> None:
    """Until the run has logged `step` (in a line past the first `after_line` ones)."""
    deadline = time.monotonic() + timeout
    while max(logged_steps(metrics)[after_line:], default=0) < step:
        assert proc.poll() is None, f"the run ended before step {step}: {proc.stdout.read()}"
        assert time.monotonic() < deadline, "timed out waiting for training to progress"
        time.sleep(0.005)
