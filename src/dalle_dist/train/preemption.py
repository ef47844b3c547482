"""SIGTERM and SIGINT end training cleanly: finish the step, save, exit 0.

Schedulers (Slurm, Kubernetes, spot instances) and launchers (torchrun, the deepspeed
launcher) send SIGTERM, then SIGKILL after a grace period. The handler only records the
signal; the loop reads the record after each step and, since the signal may reach one
rank only or reach ranks at different steps, all ranks agree at the next sync point (the
metrics all-reduce, train/loop.py) before they stop together at the same step. A second
Ctrl-C interrupts at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_received: list[str] = []


def stop_requested() -> bool:
    """True once SIGTERM or SIGINT arrived in this process."""
    return bool(_received)


def stop_signal_name() -> str:
    return _received[0] if _received else ""


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum).name)
    # The next Ctrl-C is not polite any more.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Record SIGTERM and SIGINT while the block runs (main thread only: where Python
    delivers signals); the previous handlers come back afterwards. A new block starts
    with no signal recorded: a process that trains again after a stop (the GPU acceptance
    run's phases, a notebook) must not stop at its first step."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
