"""What `dalle-dist selftest` tells its user: one line per check as it ends, and the
whole run as one JSON document.

A check is PASS, FAIL or "not run: <why>"; a check that cannot run on this machine says
why instead of passing silently, so a report from a CPU machine cannot be mistaken for a
GPU one. The JSON keeps every number a check measured (`details`), because the report
is read for them (throughput, MFU, memory against the plan), not only for the verdicts.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: What an in-process check returns: (status, summary, details).
Outcome = tuple[str, str, dict[str, Any]]

NO_CUDA = "not run: no CUDA"


@dataclass
class Check:
    name: str
    status: str  # PASS, FAIL, or "not run: <why>"
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    cuda_only: bool = False
    seconds: float = 0.0


class Report:
    """The checks so far; each is printed as it is added, so a user watching a long GPU
    run sees every verdict when it is reached, not at the end."""

    def __init__(self, device: torch.device, quick: bool) -> None:
        self.device, self.quick = device, quick
        self.checks: list[Check] = []
        self.started = time.perf_counter()
        self.extra: dict[str, Any] = {}

    def add(self, check: Check) -> None:
        self.checks.append(check)
        word = {"PASS": "PASS", "FAIL": "FAIL"}.get(check.status, "not run")
        text = check.summary if check.status in ("PASS", "FAIL") else \
            check.status.removeprefix("not run: ")
        print(f"{word:<8} {check.name}" + (f": {text}" if text else ""), flush=True)

    def add_outcome(self, name: str, outcome: Outcome, cuda_only: bool = False,
                    started: float | None = None) -> None:
        status, summary, details = outcome
        seconds = 0.0 if started is None else round(time.perf_counter() - started, 2)
        self.add(Check(name, status, summary, details, cuda_only, seconds))

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "FAIL"]

    def as_json(self) -> dict[str, Any]:
        counts = {"PASS": 0, "FAIL": 0, "not run": 0}
        for c in self.checks:
            counts[c.status if c.status in ("PASS", "FAIL") else "not run"] += 1
        return {"command": "dalle-dist selftest", "device": self.device.type,
                "quick": self.quick, "seconds": round(time.perf_counter() - self.started, 1),
                "counts": counts, "passed": not self.failed, **self.extra,
                "checks": [asdict(c) for c in self.checks]}


def guarded(report: Report, name: str, cuda_only: bool, run: Callable[[], Outcome]) -> None:
    """One in-process check; an exception is its FAIL, not the end of the run."""
    started = time.perf_counter()
    try:
        outcome = run()
    except Exception as exc:
        outcome = ("FAIL", f"{type(exc).__name__}: {exc}", {})
    report.add_outcome(name, outcome, cuda_only, started)


def environment(device: torch.device) -> dict[str, Any]:
    """The versions and the device the verdicts hold for, and whether inductor can build
    kernels there (model/toolchain.py): without its tools every check that compiles
    (FlexAttention, compiled sampling, `figures compile`) fails, and this names why."""
    import torch

    import dalle_dist
    from dalle_dist.model.toolchain import inductor_toolchain

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "dalle_dist": dalle_dist.__version__, "cuda_build": torch.version.cuda,
           "cpu_threads": torch.get_num_threads(),
           "compile_toolchain": inductor_toolchain(device.type).as_dict()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = {"name": props.name, "memory_bytes": props.total_memory,
                      "capability": f"{props.major}.{props.minor}"}
    return env
