"""`dalle-dist plan --sbatch`: the plan's chosen row as a Slurm batch script.

srun starts one task per GPU and is the launcher (backends/slurm.py maps its variables to
torchrun's); the job asks for SIGUSR1 a margin before its time limit and to be requeued;
`train` saves on that signal, requeues the job (train/preemption.py) and the requeued job
continues with `--resume auto`. Horovod rows are not written: plain srun cannot start
Horovod's ranks (the script would need horovodrun and a signal forwarded by the batch
shell), and every other backend holds the same state per GPU or less.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from dalle_dist.plan.advice import advice_order
from dalle_dist.plan.rows import Row


@dataclass(frozen=True)
class SbatchJob:
    """What the script asks Slurm for, beside the row."""

    nodes: int
    tasks_per_node: int
    gpus: bool  # request a GPU per task (plan --device cuda)
    signal_margin: int  # seconds before the time limit that SIGUSR1 comes
    time: str | None  # --time; None: the partition's limit
    partition: str | None
    job_name: str
    python: str


def backend_flags(row: Row) -> list[str]:
    """The `train` flags that choose the row's backend."""
    if row.backend == "deepspeed":
        return ["--deepspeed", "--zero_stage", str(row.zero_stage)]
    if row.backend == "single":
        return []
    return ["--distributed_backend", row.backend]


def chosen_row(rows: Sequence[Row], batch: int, gpus: int, budget: int) -> Row | None:
    """The row the recommendation leads with: of the smallest precision, the first row in
    the backends' order, on all `gpus`, that takes the batch (horovod left out); None
    when none does."""
    for precision in sorted({r.precision for r in rows}, key=advice_order):
        for row in rows:
            if (row.precision == precision and row.backend != "horovod" and row.gpus == gpus
                    and row.max_batch(budget) >= batch):
                return row
    return None


def script(row: Row, job: SbatchJob, train_flags: Sequence[str], batch: int,
           output: str, plan_line: str) -> str:
    """The batch script: #SBATCH lines, then one srun line that trains and resumes."""
    tasks = job.nodes * job.tasks_per_node
    head = [
        "#!/bin/bash",
        f"# written by: {plan_line}",
        f"# the plan's row: {row.label}, {row.precision}, global batch {batch} = "
        f"{batch // tasks} per task x {tasks} tasks",
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.tasks_per_node}",
        *([f"#SBATCH --gpus-per-node={job.tasks_per_node}"] if job.gpus else []),
        *([f"#SBATCH --time={job.time}"] if job.time else []),
        *([f"#SBATCH --partition={job.partition}"] if job.partition else []),
        "# SIGUSR1 this long before the time limit: every rank saves at its next step and",
        "# the job requeues itself; the requeued job continues from the save (--resume auto)",
        f"#SBATCH --signal=USR1@{job.signal_margin}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={job.job_name}-%j.out",
        "set -euo pipefail",
        "",
        "# Your data, e.g. DATA=\"--image_text_folder ./pairs --vae_path vae.pt\"; empty: the",
        "# built-in shapes. A hung rank ends the job after --collective_timeout seconds;",
        "# then read its log with: dalle-dist doctor " + f"{job.job_name}-JOBID.out",
        'DATA="${DATA:-}"',
        "",
    ]
    command = [job.python, "-m", "dalle_dist", "train", *backend_flags(row),
               "--precision", row.precision, "--batch_size", str(batch), *train_flags]
    line = ("srun --kill-on-bad-exit=1 " + shlex.join(command) + " $DATA "
            + shlex.join(["--dalle_output_file_name", output, "--resume", "auto"]))
    return "\n".join([*head, line, ""])


__all__ = ["SbatchJob", "backend_flags", "chosen_row", "script"]
