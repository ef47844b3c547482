"""SIGTERM and SIGINT end training cleanly: finish the step, save, exit 0.

Schedulers (Slurm, Kubernetes, spot instances) and launchers (torchrun, the deepspeed
launcher) send SIGTERM, then SIGKILL after a grace period. Inside a Slurm job, SIGUSR1
and SIGUSR2 do the same: the warning a job asks for before its time limit
(`#SBATCH --signal=USR1@120`, as `plan --sbatch` writes it); after such a stop the job
requeues itself when it was submitted with --requeue (requeue_after_stop).

The handler only records the signal; the loop reads the record after each step and,
since the signal may reach one rank only or reach ranks at different steps, all ranks
agree at the next sync point (the metrics all-reduce, train/loop.py) before they stop
together at the same step. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from dalle_dist.backends import slurm

_received: list[str] = []
#: the signals a Slurm job asks for before its time limit; outside Slurm they keep their
#: default action (they end the process)
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def stop_requested() -> bool:
    """True once SIGTERM or SIGINT arrived in this process."""
    return bool(_received)


def stop_signal_name() -> str:
    return _received[0] if _received else ""


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum).name)
    # The next Ctrl-C is not polite any more.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A signal to a run that is ending already: SIGUSR1/SIGUSR2 in a Slurm job after
    the loop, SIGTERM after this process requeued its job. A Python handler rather than
    SIG_IGN, which the processes started later (scontrol, workers) would inherit."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Record SIGTERM and SIGINT while the block runs (main thread only: where Python
    delivers signals); the previous handlers come back afterwards. A new block starts
    with no signal recorded: a process that trains again after a stop (the GPU acceptance
    run's phases, a notebook) must not stop at its first step. Inside a Slurm job,
    SIGUSR1 and SIGUSR2 are recorded too, and ignored after the block."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGTERM, signal.SIGINT, *(REQUEUE_SIGNALS if slurm.in_job() else ())]
    previous = {sig: signal.signal(sig, _handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # The time limit's warning after the last step finds a run that is ending
            # (its last save, the replica check, the fidelity evaluation): at its default
            # action it would kill the process there, and the finished job end FAILED.
            late = sig in REQUEUE_SIGNALS and handler == signal.SIG_DFL
            signal.signal(sig, _ignore if late else handler)


def requeue_after_stop(say: Callable[[str], None]) -> None:
    """On the root, after a stop by SIGUSR1/SIGUSR2 inside a Slurm job has saved on every
    rank: `scontrol requeue` the job when it was submitted with --requeue (it then
    restarts its script, whose `--resume auto` continues from the save), and say what
    happened. A SIGTERM stop (scancel, preemption) is not requeued: a cancel stays one,
    and Slurm requeues a preempted job by itself when it is configured to."""
    name = stop_signal_name()
    if not slurm.in_job() or name not in {s.name for s in REQUEUE_SIGNALS}:
        return
    job = os.environ["SLURM_JOB_ID"]
    if slurm.job_field(job, "Requeue") != "1":
        say(f"Slurm job {job} was not submitted with --requeue: submit it again to continue "
            "(its command has --resume auto, or add it)")
        return
    # The requeue ends this job's processes: SIGTERM, while scontrol runs or just after,
    # then SIGKILL KillWait seconds later. Left at its default, SIGTERM killed this
    # process before the lines below and the stop's own message reached the log; from
    # here it is ignored, and the process ends by itself within those seconds.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _ignore)
    failed = slurm.requeue(job)
    say(f"Slurm job {job} requeued: it restarts and continues from the save" if not failed
        else f"warning: scontrol requeue {job} failed ({failed}): submit the job again")
