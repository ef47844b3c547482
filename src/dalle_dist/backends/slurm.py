"""Slurm: `srun` as a launcher, and what a job says about itself.

A job step started by `srun -n N python -m dalle_dist train ...` gives each task
SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, not torchrun's RANK, WORLD_SIZE and
LOCAL_RANK. When torchrun's variables are absent and a step's are present, the
torch.distributed backends take the step's (step_launch_env): the rendezvous host is the
first host of the step's node list, the port derived from the job id unless MASTER_PORT is
set. torchrun run inside a Slurm job sets its own variables, and those win.

Node lists come compressed: `gpu[001-004,007],cpu12`, `rack[1-2]-n[01-02]`
(expand_nodelist); tasks per node too: `2(x3),1` (tasks_per_node).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from dalle_dist.errors import ConfigError

#: torchrun's variables: any of them set means a launcher other than srun started us
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
#: what an srun task has (a batch script's shell has SLURM_JOB_ID but not SLURM_PROCID
#: alone: sbatch sets SLURM_PROCID=0 for it, without SLURM_STEP_ID's step)
STEP_ENV = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID")
#: the rendezvous port is PORT_BASE + job id % PORT_SPAN: below Linux's ephemeral range
#: (32768 on), where the kernel hands out client ports that could take it first
PORT_BASE, PORT_SPAN = 12000, 20000


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: `a[1,3],b` -> [`a[1,3]`, `b`]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(name: str) -> list[str]:
    """One host pattern, each bracket a list of numbers and ranges (zero padding kept),
    several brackets multiplied out in order."""
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    values = []
    for item in match.group(1).split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a Slurm host range: [{match.group(1)}] in {name!r}")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            values.append(str(number).zfill(width))
    return [head + value + rest for value in values for rest in _expand_one(tail)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list -> every host, in order."""
    hosts = [host for part in _split_top(nodelist) for host in _expand_one(part)]
    if not hosts:
        raise ValueError(f"an empty Slurm node list: {nodelist!r}")
    return hosts


def tasks_per_node(text: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE -> one count per node:
    `2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"not a Slurm tasks-per-node list: {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def in_job(environ: Mapping[str, str] = os.environ) -> bool:
    """Inside a Slurm job (its batch script, or a step of it)."""
    return bool(environ.get("SLURM_JOB_ID"))


def in_step(environ: Mapping[str, str] = os.environ) -> bool:
    """Started by srun as one task of a job step."""
    return all(environ.get(name) for name in STEP_ENV)


def step_launch_env(environ: Mapping[str, str] = os.environ) -> dict[str, str] | None:
    """torchrun's variables from an srun step's; None when torchrun's are set (they win)
    or this is no step. ConfigError when the step's node list cannot be read."""
    if any(name in environ for name in TORCHRUN_ENV) or not in_step(environ):
        return None
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    try:
        host = environ.get("MASTER_ADDR") or expand_nodelist(nodelist)[0]
        per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get(
            "SLURM_TASKS_PER_NODE", "")
        counts = tasks_per_node(per_node) if per_node else None
    except ValueError as error:
        raise ConfigError(f"srun: {error}", "start the ranks with torchrun inside the job "
                          "instead, or set MASTER_ADDR") from None
    node = int(environ.get("SLURM_NODEID", "0"))
    job = int(environ.get("SLURM_JOB_ID", "0") or 0)
    world = environ.get("SLURM_STEP_NUM_TASKS") or environ["SLURM_NTASKS"]  # (srun -n)
    env = {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": world,
           "LOCAL_RANK": environ["SLURM_LOCALID"], "MASTER_ADDR": host,
           "MASTER_PORT": environ.get("MASTER_PORT") or str(PORT_BASE + job % PORT_SPAN)}
    if counts is not None and node < len(counts):
        env["LOCAL_WORLD_SIZE"] = str(counts[node])
    return env


def adopt_step_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Set torchrun's variables from an srun step's (step_launch_env); True when it did."""
    env = step_launch_env(environ)
    if env is None:
        return False
    environ.update(env)
    return True


#: what a task started by horovodrun or an MPI launcher has
MPI_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def check_horovod_launch(environ: Mapping[str, str] = os.environ) -> None:
    """Horovod started by plain srun (no horovodrun, no MPI) would make each task a job of
    one rank, training alone: refused, with the command that works."""
    if in_step(environ) and not any(environ.get(name) for name in MPI_ENV):
        raise ConfigError(
            "backend horovod under srun: without horovodrun or MPI, each task would train "
            "alone", "in the job script run: horovodrun -np $SLURM_NTASKS -H "
            "$(scontrol show hostnames | sed \"s/$/:$SLURM_NTASKS_PER_NODE/\" | paste -sd,) "
            "python -m dalle_dist train ... (or srun --mpi=pmix with an MPI build of Horovod)")


def check_single_launch(environ: Mapping[str, str] = os.environ) -> None:
    """`srun -n N` (N > 1) with the default single backend would start N runs, each
    training alone and writing the same files: refused, naming the flag."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS", "1")
    if in_step(environ) and tasks.isdigit() and int(tasks) > 1 and not any(
            name in environ for name in TORCHRUN_ENV):
        raise ConfigError(
            f"srun started {tasks} tasks, and the single backend would train alone in each "
            "(writing the same files)", "add --distributed_backend torch (or fsdp, or "
            "--deepspeed), or run one task: srun -n 1")


@dataclass(frozen=True)
class SlurmJob:
    """What `check` reports of the Slurm job it runs in."""

    job_id: str
    nodes: list[str]
    tasks: str
    gpus_per_task: str
    requeue: bool | None  # None: scontrol did not say

    @property
    def line(self) -> str:
        requeue = {True: "on", False: "off", None: "unknown (scontrol did not answer)"}
        return (f"Slurm job {self.job_id}: {len(self.nodes)} node(s) ({', '.join(self.nodes)}), "
                f"{self.tasks} task(s), GPUs per task {self.gpus_per_task}, requeue "
                f"{requeue[self.requeue]}")


def _scontrol(*args: str, timeout: float) -> subprocess.CompletedProcess[str] | str:
    """`scontrol ARGS`, or why it could not run (missing, failed to start, no answer
    within `timeout` seconds)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return "scontrol not found"
    try:
        return subprocess.run([scontrol, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error).splitlines()[0]


def job_field(job_id: str, name: str, timeout: float = 10.0) -> str | None:
    """One `Name=value` field of `scontrol show job -o JOB`; None when scontrol is
    missing, fails or does not answer within `timeout` seconds."""
    out = _scontrol("show", "job", "-o", job_id, timeout=timeout)
    if isinstance(out, str) or out.returncode != 0:
        return None
    match = re.search(rf"(?:^|\s){re.escape(name)}=(\S*)", out.stdout)
    return match.group(1) if match else None


def current_job(environ: Mapping[str, str] = os.environ) -> SlurmJob | None:
    """The job this process runs in; None outside Slurm."""
    if not in_job(environ):
        return None
    job_id = environ["SLURM_JOB_ID"]
    try:
        nodes = expand_nodelist(environ.get("SLURM_JOB_NODELIST", ""))
    except ValueError:
        nodes = [environ.get("SLURM_JOB_NODELIST", "?")]
    requeue = job_field(job_id, "Requeue")
    return SlurmJob(job_id, nodes, environ.get("SLURM_NTASKS", "?"),
                    environ.get("SLURM_GPUS_PER_TASK") or environ.get("SLURM_GPUS_ON_NODE")
                    or "none", None if requeue is None else requeue == "1")


def requeue(job_id: str, timeout: float = 30.0) -> str:
    """`scontrol requeue JOB`; the error's first line, or "" when it was requeued.

    Run from inside the job, scontrol is one of the processes the requeue ends: when the
    job's kill reaches it before it exits, it dies silently with a requeue that took. So
    a failure counts as a requeue when the job's restart count moved on."""
    restarts = job_field(job_id, "Restarts")
    out = _scontrol("requeue", job_id, timeout=timeout)
    if not isinstance(out, str) and out.returncode == 0:
        return ""
    if restarts is not None and job_field(job_id, "Restarts") not in (None, restarts):
        return ""
    if isinstance(out, str):
        return out
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else f"scontrol ended with status {out.returncode}"


__all__ = ["PORT_BASE", "PORT_SPAN", "SlurmJob", "adopt_step_env", "check_horovod_launch",
           "check_single_launch", "current_job", "expand_nodelist", "in_job", "in_step",
           "job_field", "requeue", "step_launch_env", "tasks_per_node"]
