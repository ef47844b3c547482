"""The training checks of `dalle-dist selftest`: each backend (world size 1, under its
own launcher) in each precision trains through dalle_dist's own loop, and the numbers its
rank reports become verdicts: `train B P` (the loss fell and stayed finite, the matmuls
ran in P's dtype; samples/s and MFU), and on CUDA `memory B P` (the step's peak against
`dalle-dist plan --json`) and `host syncs B P` (none on a quiet step of our backends).

The verdicts are functions of the worker's numbers (memory_check, sync_check), so the
GPU-only ones are tested on a CPU machine too.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from typing import TYPE_CHECKING, Any

import torch

from dalle_dist.selftest.models import MODELS
from dalle_dist.selftest.report import NO_CUDA, Check, Report
from dalle_dist.selftest.runs import run_specs

if TYPE_CHECKING:
    from pathlib import Path

#: (batch, steps, warmup, log_every) of the training checks
TRAIN_SIZES = {"cuda": (16, 30, 5, 10), "cpu": (4, 8, 2, 3)}
QUICK_TRAIN_SIZES = {"cuda": (16, 12, 4, 4), "cpu": (4, 6, 2, 2)}
#: (backend, ZeRO stage): each trained at world size 1 under its own launcher
RUNS = (("single", None), ("deepspeed", 2), ("deepspeed", 3), ("fsdp", None))
#: --quick: each backend once and each precision at least once; on the CPU single in all
#: three (fp16 is DeepSpeed's only refusal there)
QUICK_RUNS = {
    "cuda": {("single", None, "fp32"), ("deepspeed", 2, "fp16"), ("deepspeed", 3, "bf16"),
             ("fsdp", None, "bf16")},
    "cpu": {("single", None, "fp32"), ("single", None, "bf16"), ("single", None, "fp16"),
            ("deepspeed", 2, "bf16"), ("deepspeed", 3, "fp32"), ("fsdp", None, "fp32")}}
#: Backends whose quiet steps must not synchronize; the others' counts are reported.
SYNC_FREE_BACKENDS = ("single", "fsdp", "torch")
#: plan's estimate / the measured peak must lie here: tests/test_plan.py's band for the
#: CPU, where the estimate's activation model is measured. What a GPU adds is put on the
#: estimate's side, not into the band: autocast's low-precision weight copies (plan
#: counts them: autocast_weight_copies) and cuBLAS's workspace, which torch allocates
#: through its caching allocator, so max_memory_allocated sees it (CUBLAS_WORKSPACE_BYTES).
#: What the band is for: activations kept that should have been freed or recomputed
#: (2x and more), a sharded engine that is not (ZeRO-3, FSDP: params + grads + Adam back
#: to whole); an extra fp32 gradient copy (about 3% at these sizes) is below it.
PLAN_RATIO_BAND = (0.75, 1.25)
#: cuBLAS's workspace on one stream: torch's default CUBLAS_WORKSPACE_CONFIG is
#: ":4096:8" (8 x 4 MiB) on Hopper and newer, ":4096:2:16:8" (8.1 MiB) before; the larger.
CUBLAS_WORKSPACE_BYTES = 32 * 2**20


def run_label(backend: str, stage: int | None) -> str:
    """How a check names a run: the backend, with its ZeRO stage for DeepSpeed."""
    return backend if stage is None else f"{backend}-zero{stage}"


def plan_rows(model: dict[str, Any], batch: int, memory: int) -> list[dict[str, Any]]:
    """`dalle-dist plan --json` rows for the training checks' model and batch on one GPU
    of `memory` bytes: the command line itself, run in this process (dalle_dist.cli.main;
    a fresh interpreter would cost seconds of imports for a computation of milliseconds)."""
    from dalle_dist.cli import main as dalle_dist_main

    argv = ["plan", "--json", *(f"--{k}={v}" for k, v in model.items()), "--batch_size",
            str(batch), "--gpus", "1", "--device", "cuda", "--gpu_memory",
            f"{memory // 2**20}MiB"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = dalle_dist_main(argv)
        except SystemExit as exc:  # argparse's answer to a flag plan no longer has
            status = exc.code
    if status != 0:
        raise RuntimeError(f"exit status {status}: {err.getvalue()[-500:]}")
    return json.loads(out.getvalue())["rows"]


def skip_reason(backend: str, stage: int | None, precision: str, device: torch.device,
                quick: bool) -> str | None:
    """Why a (backend, stage, precision) run is not trained here, or None: the backend
    or the precision is unusable on this machine (the registry's verdicts, as `dalle-dist
    check` gives them), or --quick leaves it out."""
    from dalle_dist.backends.registry import backend_verdict, precision_verdict

    cuda = device.type == "cuda"
    verdict = backend_verdict(backend, cuda)
    if not verdict.usable:
        return f"not run: {verdict.reason} ({verdict.fix})"
    verdict = precision_verdict(backend, precision, cuda)
    if not verdict.usable:
        return f"not run: {verdict.reason}"
    if quick and (backend, stage, precision) not in QUICK_RUNS[device.type]:
        return "not run: --quick"
    return None


def train_checks(report: Report, device: torch.device, quick: bool, peaks: dict[str, float],
                 folder: Path, timeout: float = 600) -> None:
    """Every (backend, stage, precision) this machine can train, grouped into one rank
    process per backend, then three checks per run, in RUNS x PRECISIONS order."""
    from dalle_dist.backends.precision_kinds import PRECISIONS

    cuda = device.type == "cuda"
    model = MODELS[device.type]
    batch, steps, warmup, log_every = (QUICK_TRAIN_SIZES if quick
                                       else TRAIN_SIZES)[device.type]
    rows: list[dict[str, Any]] = []
    if cuda:
        try:
            rows = plan_rows(model, batch, torch.cuda.get_device_properties(device).total_memory)
        except (RuntimeError, json.JSONDecodeError, KeyError) as exc:
            print(f"warning: dalle-dist plan --json failed ({exc}); the memory checks fail",
                  flush=True)
    groups: dict[str, list[tuple[int | None, str]]] = {}
    skipped: dict[tuple[str, int | None, str], str] = {}
    for backend, stage in RUNS:
        for precision in PRECISIONS:
            why = skip_reason(backend, stage, precision, device, quick)
            if why:
                skipped[(backend, stage, precision)] = why
            else:
                groups.setdefault(backend, []).append((stage, precision))
    results: dict[tuple[str, int | None, str], tuple[dict[str, Any], float]] = {}
    for backend, runs in groups.items():
        specs = [{"kind": "train", "backend": backend, "zero_stage": stage,
                  "precision": precision, "device": device.type, "model": model,
                  "batch": batch, "steps": steps, "warmup": warmup, "log_every": log_every,
                  "clip": 0.5, "peaks": peaks} for stage, precision in runs]
        started = time.perf_counter()
        outs = run_specs(backend, specs, folder, timeout=timeout)
        per_run = round((time.perf_counter() - started) / len(runs), 2)
        for (stage, precision), out in zip(runs, outs, strict=True):
            results[(backend, stage, precision)] = (out, per_run)
    for backend, stage in RUNS:
        for precision in PRECISIONS:
            key = (backend, stage, precision)
            label = f"{run_label(backend, stage)} {precision}"
            if key in skipped:
                for name, cuda_only in ((f"train {label}", False), (f"memory {label}", True),
                                        (f"host syncs {label}", True)):
                    status = NO_CUDA if cuda_only and not cuda else skipped[key]
                    report.add(Check(name, status, cuda_only=cuda_only))
                continue
            out, seconds = results[key]
            report.add(Check(f"train {label}", *train_verdict(out, precision), out,
                             seconds=seconds))
            report.add(memory_check(label, out, rows, backend, stage, precision, cuda))
            report.add(sync_check(label, out, backend, cuda))


def train_verdict(out: dict[str, Any], precision: str) -> tuple[str, str]:
    """`train B P` from its rank's numbers: the loss finite and falling, P's dtype among
    the matmuls' (a precision flag that changed nothing would pass otherwise)."""
    if not out.get("ok"):
        return "FAIL", out.get("error", "the run failed")[-500:]
    losses = out["logged_losses"]
    want = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
    if not losses or not all(math.isfinite(x) for x in losses):
        return "FAIL", f"loss not finite: {losses}"
    if len(losses) > 1 and not losses[-1] < losses[0]:
        return "FAIL", f"the loss did not fall: {losses}"
    if want not in out["matmul_dtypes"]:
        return "FAIL", f"precision {precision} but the matmuls ran in {out['matmul_dtypes']}"
    mfu = f", MFU {out['mfu']:.3f}" if "mfu" in out else ""
    tf32 = " (TF32 on)" if precision == "fp32" and out.get("tf32") else ""
    return "PASS", (f"{out['samples_per_s']} samples/s{mfu}{tf32}, loss "
                    f"{losses[0]:.3f} -> {losses[-1]:.3f}")


def memory_check(label: str, out: dict[str, Any], rows: list[dict[str, Any]], backend: str,
                 stage: int | None, precision: str, cuda: bool) -> Check:
    """`memory B P`: the step's measured peak against plan's row for (B, stage, P), so
    that `dalle-dist plan` cannot drift from what training really allocates."""
    name = f"memory {label}"
    if not cuda:
        return Check(name, NO_CUDA, cuda_only=True)
    if not out.get("ok"):
        return Check(name, "not run: the training run failed", cuda_only=True)
    from dalle_dist.plan import CUDA_CONTEXT_BYTES

    row = next((r for r in rows if r["backend"] == backend and r["zero_stage"] == stage
                and r["precision"] == precision), None)
    if row is None:
        return Check(name, "FAIL", f"dalle-dist plan has no row for {label}", cuda_only=True)
    # max_memory_allocated has no CUDA context, but it has cuBLAS's workspace
    estimate = row["peak"] - CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    measured = out["peak_bytes"]
    ratio = estimate / max(measured, 1)
    low, high = PLAN_RATIO_BAND
    details = {"measured_bytes": measured, "plan_estimate_bytes": estimate,
               "ratio": round(ratio, 3), "band": PLAN_RATIO_BAND, "plan_items": row["items"]}
    summary = (f"peak {measured / 2**30:.2f} GiB, plan {estimate / 2**30:.2f} GiB "
               f"(ratio {ratio:.2f})")
    return Check(name, "PASS" if low <= ratio <= high else "FAIL", summary, details, True)


def sync_check(label: str, out: dict[str, Any], backend: str, cuda: bool) -> Check:
    """`host syncs B P`: a quiet step of our own backends never waits for the GPU (a
    sync there idles it every step); DeepSpeed's engine is not ours, so only reported."""
    name = f"host syncs {label}"
    if not cuda:
        return Check(name, NO_CUDA, cuda_only=True)
    if not out.get("ok"):
        return Check(name, "not run: the training run failed", cuda_only=True)
    worst, median = out["syncs_quiet_step_max"], out["syncs_quiet_step_median"]
    details = {"by_step": out["syncs_by_step"], "quiet_step_max": worst,
               "quiet_step_median": median, "held_to_zero": backend in SYNC_FREE_BACKENDS}
    summary = f"{median} per quiet step (max {worst})"
    if backend not in SYNC_FREE_BACKENDS:
        return Check(name, "PASS", summary + f"; {backend}'s engine, reported only", details,
                     True)
    return Check(name, "PASS" if worst == 0 else "FAIL", summary, details, True)
