"""`python -m tests.backends.sync_probe ARGS` runs `python -m dalle_dist ARGS` with every
host synchronisation and every collective of the training loop recorded, per optimizer
step, into $SYNC_PROBE_DIR/rank<N>.json (tests/backends/test_host_syncs.py reads them).

Host synchronisations are seen by a TorchFunctionMode: `.item()`, `.tolist()`, `float()`,
`int()`, `bool()` (an `if` on a tensor), `.cpu()`, `.numpy()` and the ops whose output
shape depends on values (nonzero, masked_select, unique). On a GPU each one waits for
every queued kernel. Each is attributed to the code that called it: `ours` (a frame
under src/dalle_dist), or the engine's (torch, deepspeed, horovod).

Collectives are seen by wrapping torch.distributed's functions (FSDP2 and DeepSpeed call
them from Python), Horovod's all-reduce functions, and a DDP communication hook (DDP's
reducer calls the process group from C++, invisible otherwise; the hook does what DDP's
default does: all-reduce and divide by the world size). Each is tagged with the phase it
ran in: `micro` (a micro-batch of an accumulation window other than the last), or
`step` (everything else).

Steps are delimited by RunLog.progress, which the loop calls once at the end of every
optimizer step, after that step's logging, sampling and saving; the record is written when
the loop ends its progress bar (a rank of a multi-process run ends with os._exit).

With $CLIP_PROBE_DIR set, the same run also checks its first step's clipping
(tests/backends/clip_probe.py), whose gathers are left out of the record.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.overrides import TorchFunctionMode

SYNC_OPS = {"item", "tolist", "__float__", "__int__", "__index__", "__bool__", "cpu", "numpy",
            "nonzero", "masked_select", "unique"}
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
               "barrier", "all_gather_object", "broadcast_object_list", "all_to_all_single",
               "reduce", "all_reduce_coalesced", "monitored_barrier")
#: Frames that only pass a call on (torch's Tensor methods, this probe, context managers).
_PASS_THROUGH = ("torch/_tensor.py", "torch/overrides.py", "sync_probe.py", "/contextlib.py",
                 "torch/utils/_device.py")


def owner(filename: str) -> str:
    """Whose code a frame is: ours, an engine's, or something else."""
    if "/dalle_dist/" in filename and "/tests/" not in filename:
        return "ours"
    for package in ("deepspeed", "horovod", "torch"):
        if f"/{package}/" in filename:
            return package
    return "other"


def caller() -> tuple[str, str]:
    """(owner, file:line) of the first frame outside torch's pass-through layers."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.endswith(_PASS_THROUGH):
        frame = frame.f_back
    if frame is None:
        return "other", "?"
    name = frame.f_code.co_filename
    return owner(name), f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno}"


class Recorder:
    """Events of the current step; `close_step` files them under the step's number."""

    def __init__(self) -> None:
        self.active = False
        self.inside = False  # within a recorded collective: its inner calls are its own
        self.phase = "step"
        self.step = 0
        self.steps: dict[int, dict[str, list[list[str]]]] = defaultdict(
            lambda: {"syncs": [], "collectives": []})

    def sync(self, op: str) -> None:
        if self.active:
            who, where = caller()
            self.steps[self.step + 1]["syncs"].append([op, who, where])

    def collective(self, name: str, who: str, where: str) -> None:
        if self.active:
            self.steps[self.step + 1]["collectives"].append([name, who, where, self.phase])

    def close_step(self) -> None:
        if self.active:
            self.step += 1
            _ = self.steps[self.step]  # a step with no events is recorded too


RECORDER = Recorder()


class SyncMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in SYNC_OPS:
            RECORDER.sync(func.__name__)
        return func(*args, **(kwargs or {}))


def _counted(name: str, function: Any) -> Any:
    """`function`, recording each outermost call (a collective that calls another, as
    torch.distributed's do through their module, counts once)."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if RECORDER.inside:
            return function(*args, **kwargs)
        who, where = caller()
        RECORDER.collective(name, who, where)
        RECORDER.inside = True
        try:
            return function(*args, **kwargs)
        finally:
            RECORDER.inside = False
    wrapper.__probe_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def wrap_torch_collectives() -> None:
    from torch.distributed import distributed_c10d

    for name in COLLECTIVES:
        for module in (dist, distributed_c10d):
            function = getattr(module, name, None)
            if callable(function) and not getattr(function, "__probe_wrapped__", False):
                setattr(module, name, _counted(name, function))


def wrap_ddp() -> None:
    """Count DDP's bucket all-reduces through a hook that does what DDP's default does."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    original_init = DistributedDataParallel.__init__

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks any annotation
        RECORDER.collective("ddp_bucket_all_reduce", "torch", "ddp reducer")
        RECORDER.inside = True
        try:
            return allreduce_hook(state, bucket)
        finally:
            RECORDER.inside = False

    def init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.register_comm_hook(None, hook)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]


def wrap_horovod() -> None:
    import horovod.torch as hvd
    import horovod.torch.optimizer as hvd_optimizer

    for name in ("allreduce_async_", "grouped_allreduce_async_"):
        setattr(hvd_optimizer, name, _counted(f"horovod.{name}", getattr(hvd_optimizer, name)))
    for name in ("allreduce", "allreduce_", "allgather_object", "broadcast_object", "barrier"):
        setattr(hvd, name, _counted(f"horovod.{name}", getattr(hvd, name)))


def wrap_loop() -> None:
    """Step boundaries (RunLog) and accumulation phases (Engine.micro_batch)."""
    from dalle_dist.backends.deepspeed import DeepSpeedEngine
    from dalle_dist.backends.engine import Engine
    from dalle_dist.train.run_log import RunLog

    start, progress, end = RunLog.start_progress, RunLog.progress, RunLog.end_progress

    def start_progress(self: RunLog, *args: Any, **kwargs: Any) -> None:
        RECORDER.active = True
        start(self, *args, **kwargs)

    def progress_step(self: RunLog, *args: Any, **kwargs: Any) -> None:
        progress(self, *args, **kwargs)
        RECORDER.close_step()

    def end_progress(self: RunLog) -> None:
        RECORDER.active = False
        end(self)
        write_record()  # here: a rank of a multi-process run ends with os._exit

    RunLog.start_progress, RunLog.progress = start_progress, progress_step  # type: ignore
    RunLog.end_progress = end_progress  # type: ignore[method-assign]

    for engine_class in (Engine, DeepSpeedEngine):
        micro_batch = engine_class.micro_batch

        def phased(self: Engine, last: bool, _inner: Any = micro_batch) -> Any:
            RECORDER.phase = "step" if last else "micro"
            return _inner(self, last)

        engine_class.micro_batch = phased  # type: ignore[method-assign]


def rank() -> int:
    for name in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def write_record() -> None:
    out = Path(os.environ["SYNC_PROBE_DIR"]) / f"rank{rank()}.json"
    out.write_text(json.dumps({"steps": RECORDER.steps}))


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """Around a test's own work inside a step (clip_probe's gathers): not the loop's."""
    active, RECORDER.active = RECORDER.active, False
    try:
        yield
    finally:
        RECORDER.active = active


def main() -> int:
    args = sys.argv[1:]
    wrap_torch_collectives()
    wrap_ddp()
    if "horovod" in args:
        wrap_horovod()
    wrap_loop()
    if "CLIP_PROBE_DIR" in os.environ:
        from tests.backends import clip_probe

        clip_probe.install(Path(os.environ["CLIP_PROBE_DIR"]) / "clip.json", unobserved)
    from dalle_dist.cli import main as dalle_main

    with SyncMode():
        return dalle_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
