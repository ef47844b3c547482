"""The one-command acceptance run for a GPU machine (`make gpu-check`); it also runs on CPU.

Prints one line per check (PASS, FAIL, or "not run: <why>"), writes the whole report as
JSON (--out), and exits 1 when any check FAILs. Checks, in the order they run:

  cuda smoke        `dalle-dist check --cuda-smoke`: torch reaches every GPU
  train B P         30 optimizer steps (CPU: a few) of backend B (single, deepspeed-zero2,
                    deepspeed-zero3, fsdp; world size 1, each under its own launcher) in
                    precision P (fp32, TF32 where the run turns it on; bf16; fp16) through
                    dalle_dist's own loop: the loss falls and stays finite, the matmuls ran
                    in P's dtype; reports samples/s and MFU against the matmul peak this
                    script measures for that dtype
  memory B P        (CUDA) the step's peak allocated memory against `dalle-dist plan --json`'s
                    estimate for that row: estimate / measured within PLAN_RATIO_BAND
  host syncs B P    (CUDA) synchronizing CUDA calls per step (torch.cuda.set_sync_debug_mode),
                    on steps that neither log nor follow a logging step: 0 for our backends,
                    reported for DeepSpeed's engine (its internals are not ours)
  resume P          a run stopped by SIGTERM after step k and resumed with --resume auto
                    ends with the weights of an uninterrupted run (on CUDA, at least as
                    close as two uninterrupted runs are to each other)
  attention X D     every --attn_impl path of pattern X through the attention layer, dtype D,
                    against the dense reference (fp32, TF32 off): output and gradients;
                    FlexAttention forward + backward on CUDA, forward only on the CPU
  flex recompiles   (CUDA) torch.compile builds at most one flex kernel per (pattern, shape)
  sampling static cache   cached == uncached sampling, token for token; s/image at batch 1
  sampling half precision generate --precision: the DALL-E cast to bf16 (CUDA) and fp16
                          decodes through its cache within rounding of the uncached
                          forward; s/image against fp32
  sampling cuda graphs    (CUDA) the compiled decode step: same tokens, s/image, speedup
  time budget       (CUDA) the whole run took at most BUDGET_S seconds

GPU sizes: DALL-E dim 512, depth 8, 8 heads x 64, 64 text + 32 x 32 = 1024 image tokens,
batch 16. CPU sizes: dim 64, depth 2, 64 image tokens, batch 4. --quick (what `make test`
runs on the CPU) trains each backend in one precision (single in all three) and skips
compiling FlexAttention on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if (Path(__file__).resolve().parent.parent / "src" / "dalle_dist").is_dir():
    # this checkout's code, as the launched ranks get it (a checkout mounted into the
    # Docker image may differ from the package installed there)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import acceptance_checks as checks
from common import PEAK_DTYPES, device_matmul_peak

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "acceptance_worker.py"
BIN = Path(sys.executable).parent

MODELS = {
    "cuda": {"dim": 512, "depth": 8, "heads": 8, "dim_head": 64, "text_seq_len": 64,
             "image_size": 128, "num_layers": 2, "num_tokens": 1024},
    "cpu": {"dim": 64, "depth": 2, "heads": 2, "dim_head": 32, "text_seq_len": 16,
            "image_size": 32, "num_layers": 2, "num_tokens": 128},
}
#: (batch, steps, warmup, log_every) of the training checks
TRAIN_SIZES = {"cuda": (16, 30, 5, 10), "cpu": (4, 8, 2, 3)}
QUICK_CPU_TRAIN_SIZES = (4, 6, 2, 2)
#: (backend, ZeRO stage): each trained at world size 1 under its own launcher
RUNS = (("single", None), ("deepspeed", 2), ("deepspeed", 3), ("fsdp", None))
#: --quick on the CPU: each backend in one precision, single in all three
QUICK_RUNS = {("single", None, "fp32"), ("single", None, "bf16"), ("single", None, "fp16"),
              ("deepspeed", 2, "bf16"), ("deepspeed", 3, "fp32"), ("fsdp", None, "fp32")}
#: Backends whose quiet steps must not synchronize; the others' counts are reported.
SYNC_FREE_BACKENDS = ("single", "fsdp")
#: plan's estimate / the measured peak must lie here (tests/test_plan.py's band on CPU).
PLAN_RATIO_BAND = (0.75, 1.25)
#: the whole run on one GPU (issue 13: at most 8 minutes)
BUDGET_S = 480.0
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
    """The checks so far; each is printed as it is added."""

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

    def add_outcome(self, name: str, outcome: checks.Outcome, cuda_only: bool = False,
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
        return {"bench": "gpu_acceptance", "device": self.device.type, "quick": self.quick,
                "seconds": round(time.perf_counter() - self.started, 1), "counts": counts,
                "passed": not self.failed, **self.extra,
                "checks": [asdict(c) for c in self.checks]}


def environment(device: torch.device) -> dict[str, Any]:
    import dalle_dist

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "dalle_dist": dalle_dist.__version__, "cuda_build": torch.version.cuda,
           "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = {"name": props.name, "memory_bytes": props.total_memory,
                      "capability": f"{props.major}.{props.minor}"}
    return env


def matmul_peaks(device: torch.device) -> dict[str, float]:
    """FLOP/s of a big square matmul per dtype (CUDA: side 8192, ten per timing; CPU:
    side 1024, fp32 only)."""
    if device.type == "cuda":
        return {name: device_matmul_peak(device, name, 8192, repeats=3, inner=10)
                for name in PEAK_DTYPES}
    # fp32 only: CPU matmuls in bf16 / fp16 are not what a CPU is fast at, so an MFU
    # against them says nothing; no TF32 on a CPU either
    fp32 = device_matmul_peak(device, "fp32", 1024, repeats=3)
    return {"fp32": fp32, "tf32": fp32}


# -- processes -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This checkout's src first, so launched ranks import the code under test; torch
    extensions (DeepSpeed's CPU comm op, built once) in this venv's own folder, as the
    tests keep them (tests/conftest.py says why not the shared ~/.cache)."""
    paths = [str(ROOT / "src")] if (ROOT / "src" / "dalle_dist").is_dir() else []
    pythonpath = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, **(extra or {})}
    if os.access(sys.prefix, os.W_OK):  # not in the Docker image's system Python
        env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    return env


def launch_line(backend: str) -> list[str]:
    """How a user starts one rank of `backend` (its own launcher, world size 1)."""
    if backend == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", "1", "--master_port", str(_free_port())]
    if backend in ("fsdp", "torch"):
        return [str(BIN / "torchrun"), "--nproc_per_node", "1", "--master_port",
                str(_free_port())]
    return [sys.executable]


def run_specs(backend: str, specs: list[dict[str, Any]], folder: Path, timeout: float,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the specs in one rank process of `backend`; their results, in order (a spec
    whose process died or timed out gets the process's output tail as its error)."""
    for i, spec in enumerate(specs):
        spec["result"] = str(folder / f"result-{backend}-{i}-{time.monotonic_ns()}.json")
    spec_file = folder / f"specs-{backend}-{time.monotonic_ns()}.json"
    spec_file.write_text(json.dumps(specs))
    proc = subprocess.Popen([*launch_line(backend), str(WORKER), str(spec_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(env), start_new_session=True, cwd=folder)
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


# -- training ------------------------------------------------------------------------------


def run_label(backend: str, stage: int | None) -> str:
    return backend if stage is None else f"{backend}-zero{stage}"


def plan_rows(model: dict[str, Any], batch: int, memory: int) -> list[dict[str, Any]]:
    """`dalle-dist plan --json` rows for the training checks' model and batch on one GPU
    of `memory` bytes."""
    flags = [f"--{k}={v}" for k, v in model.items()]
    out = subprocess.run([sys.executable, "-m", "dalle_dist", "plan", "--json", *flags,
                          "--batch_size", str(batch), "--gpus", "1", "--device", "cuda",
                          "--gpu_memory", f"{memory // 2**20}MiB"],
                         capture_output=True, text=True, env=_env(), check=True, timeout=300)
    return json.loads(out.stdout)["rows"]


def _skip_reason(backend: str, stage: int | None, precision: str, device: torch.device,
                 quick: bool) -> str | None:
    from dalle_dist.backends.registry import backend_verdict, precision_verdict

    cuda = device.type == "cuda"
    verdict = backend_verdict(backend, cuda)
    if not verdict.usable:
        return f"not run: {verdict.reason} ({verdict.fix})"
    verdict = precision_verdict(backend, precision, cuda)
    if not verdict.usable:
        return f"not run: {verdict.reason}"
    if quick and not cuda and (backend, stage, precision) not in QUICK_RUNS:
        return "not run: --quick"
    return None


def train_checks(report: Report, device: torch.device, quick: bool, peaks: dict[str, float],
                 folder: Path) -> None:
    from dalle_dist.backends.precision import PRECISIONS

    cuda = device.type == "cuda"
    model = MODELS[device.type]
    batch, steps, warmup, log_every = (QUICK_CPU_TRAIN_SIZES if quick and not cuda
                                       else TRAIN_SIZES[device.type])
    rows: list[dict[str, Any]] = []
    if cuda:
        try:
            rows = plan_rows(model, batch, torch.cuda.get_device_properties(device).total_memory)
        except (subprocess.SubprocessError, json.JSONDecodeError, KeyError) as exc:
            print(f"warning: dalle-dist plan --json failed ({exc}); the memory checks fail",
                  flush=True)
    groups: dict[str, list[tuple[int | None, str]]] = {}
    skipped: dict[tuple[str, int | None, str], str] = {}
    for backend, stage in RUNS:
        for precision in PRECISIONS:
            why = _skip_reason(backend, stage, precision, device, quick)
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
        outs = run_specs(backend, specs, folder, timeout=600)
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
    name = f"memory {label}"
    if not cuda:
        return Check(name, NO_CUDA, cuda_only=True)
    if not out.get("ok"):
        return Check(name, "not run: the training run failed", cuda_only=True)
    from dalle_dist.diagnose.plan import CUDA_CONTEXT_BYTES

    row = next((r for r in rows if r["backend"] == backend and r["zero_stage"] == stage
                and r["precision"] == precision), None)
    if row is None:
        return Check(name, "FAIL", f"dalle-dist plan has no row for {label}", cuda_only=True)
    estimate = row["peak"] - CUDA_CONTEXT_BYTES  # max_memory_allocated has no context
    measured = out["peak_bytes"]
    ratio = estimate / max(measured, 1)
    low, high = PLAN_RATIO_BAND
    details = {"measured_bytes": measured, "plan_estimate_bytes": estimate,
               "ratio": round(ratio, 3), "band": PLAN_RATIO_BAND, "plan_items": row["items"]}
    summary = (f"peak {measured / 2**30:.2f} GiB, plan {estimate / 2**30:.2f} GiB "
               f"(ratio {ratio:.2f})")
    return Check(name, "PASS" if low <= ratio <= high else "FAIL", summary, details, True)


def sync_check(label: str, out: dict[str, Any], backend: str, cuda: bool) -> Check:
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


# -- resume --------------------------------------------------------------------------------


def resume_checks(report: Report, device: torch.device, quick: bool, folder: Path) -> None:
    """Per precision: straight, stopped-at-k and resumed runs of the `single` backend."""
    from dalle_dist.checkpoint.load import load_checkpoint

    cuda = device.type == "cuda"
    precisions = ("bf16", "fp16") if cuda else ("fp32",) if quick else ("fp32", "bf16")
    batch, steps, stop_at = (8, 12, 5) if cuda else (4, 6, 3)
    # dropout on, so the random streams a resumed run restores decide the weights too
    base = {"kind": "resume", "backend": "single", "device": device.type,
            "model": {**MODELS[device.type], "dropout": 0.1}, "batch": batch,
            "steps": steps, "stop_at": stop_at, "log_every": 1, "clip": 0.5,
            "deterministic": cuda}
    # cuBLAS repeats itself only with a fixed workspace (torch's deterministic mode asks it)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if cuda else None
    phases = ("straight", "interrupted", "control") if cuda else ("straight", "interrupted")
    # the interrupted run and its continuation share one output name, as a user's do
    first = [{**base, "precision": p, "phase": phase, "output": str(
        folder / f"resume-{p}-{'resumed' if phase == 'interrupted' else phase}")}
        for p in precisions for phase in phases]
    started = time.perf_counter()
    first_out = run_specs("single", first, folder, timeout=600, env=env)
    second = [{**base, "precision": p, "phase": "resumed",
               "output": str(folder / f"resume-{p}-resumed")} for p in precisions]
    second_out = run_specs("single", second, folder, timeout=600, env=env)
    seconds = round((time.perf_counter() - started) / len(precisions), 2)
    for i, precision in enumerate(precisions):
        outs = {phase: first_out[i * len(phases) + j] for j, phase in enumerate(phases)}
        outs["resumed"] = second_out[i]
        name = f"resume {precision}"
        broken = [f"{phase}: {o.get('error', '')[-400:]}" for phase, o in outs.items()
                  if not o.get("ok")]
        if broken:
            report.add(Check(name, "FAIL", "; ".join(broken), {"phases": outs}, seconds=seconds))
            continue
        if not outs["interrupted"]["stopped"] or outs["resumed"]["resumed_from_step"] != stop_at:
            report.add(Check(name, "FAIL", f"expected a stop after step {stop_at} and a resume "
                             "from it", {"phases": outs}, seconds=seconds))
            continue

        def weights(out: dict[str, Any]) -> dict[str, torch.Tensor]:
            return load_checkpoint(out["checkpoint"], out["phase"], "dalle")["weights"]

        straight = weights(outs["straight"])
        diff = max_diff(weights(outs["resumed"]), straight)
        details: dict[str, Any] = {"steps": steps, "stopped_after": stop_at,
                                   "max_abs_diff": diff}
        allowed = 0.0
        if "control" in outs:
            allowed = max_diff(weights(outs["control"]), straight)
            details["two_uninterrupted_runs_max_abs_diff"] = allowed
        ok = diff <= allowed
        summary = (f"stopped after step {stop_at} of {steps}, resumed: weights "
                   + ("identical" if diff == 0 else f"differ by {diff:.3g}")
                   + (f" (two straight runs: {allowed:.3g})" if "control" in outs else ""))
        report.add(Check(name, "PASS" if ok else "FAIL", summary, details, seconds=seconds))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# -- the rest ------------------------------------------------------------------------------


def cuda_smoke_check(device: torch.device) -> checks.Outcome:
    if device.type != "cuda":
        return NO_CUDA, "", {}
    out = subprocess.run([sys.executable, "-m", "dalle_dist", "check", "--cuda-smoke",
                          "--json"], capture_output=True, text=True, env=_env(), timeout=300,
                         check=False)
    try:
        smoke = json.loads(out.stdout)["cuda_smoke"]
    except (json.JSONDecodeError, KeyError):
        return "FAIL", f"exit status {out.returncode}: {out.stderr[-500:]}", {}
    return ("PASS" if smoke["ok"] and out.returncode == 0 else "FAIL", smoke["note"],
            {"exit_status": out.returncode, "cuda_smoke": smoke})


def attention_section(report: Report, device: torch.device, quick: bool) -> None:
    from dalle_dist.model.patterns import PATTERNS

    cuda = device.type == "cuda"
    why = "" if cuda else ("--quick (compiling FlexAttention on the CPU takes minutes)"
                           if quick else "")
    for dtype in ("fp32", "bf16"):
        for pattern in PATTERNS:
            started = time.perf_counter()
            try:
                outcome = checks.attention_check(pattern, dtype, device, run_flex=not why,
                                                 flex_backward=cuda, why_no_flex=why)
            except Exception as exc:
                outcome = ("FAIL", f"{type(exc).__name__}: {exc}", {})
            report.add_outcome(f"attention {pattern} {dtype}", outcome, started=started)


def guarded(report: Report, name: str, cuda_only: bool, run: Any) -> None:
    """One in-process check; an exception is its FAIL, not the end of the run."""
    started = time.perf_counter()
    try:
        outcome = run()
    except Exception as exc:
        outcome = ("FAIL", f"{type(exc).__name__}: {exc}", {})
    report.add_outcome(name, outcome, cuda_only, started)


SECTIONS = ("smoke", "train", "resume", "attention", "flex", "sampling")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu",
                        help="default: cuda when torch sees a GPU")
    parser.add_argument("--out", default="gpu-acceptance.json",
                        help="the JSON report (default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer training runs and no flex compile on the CPU (make test)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma list of sections (default all: {','.join(SECTIONS)})")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU (run on CPU with --device cpu, or "
              "install a CUDA build of torch: see README, GPU acceptance run)", file=sys.stderr)
        return 2
    device = (torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda"
              else torch.device("cpu"))
    sections = set(args.only.split(","))
    if sections - set(SECTIONS):
        parser.error(f"--only: unknown {', '.join(sorted(sections - set(SECTIONS)))} "
                     f"(sections: {', '.join(SECTIONS)})")
    cuda = device.type == "cuda"
    report = Report(device, args.quick)
    report.extra["environment"] = environment(device)
    peaks = matmul_peaks(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the peak's matrices: the launched ranks need the memory
    report.extra["matmul_peak_gflops"] = {k: round(v / 1e9, 1) for k, v in peaks.items()}
    repeats = 3 if cuda or not args.quick else 1
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-") as tmp:
        folder = Path(tmp)
        if "smoke" in sections:
            guarded(report, "cuda smoke", True, lambda: cuda_smoke_check(device))
        if "train" in sections:
            train_checks(report, device, args.quick, peaks, folder)
        if "resume" in sections:
            resume_checks(report, device, args.quick, folder)
    if "attention" in sections:
        attention_section(report, device, args.quick)
    if "flex" in sections:
        guarded(report, "flex recompiles", True, lambda: checks.flex_recompile_check(device))
    if "sampling" in sections:
        guarded(report, "sampling static cache", False,
                lambda: checks.sampling_static_cache_check(device, repeats))
        guarded(report, "sampling half precision", False,
                lambda: checks.sampling_half_precision_check(device, repeats))
        guarded(report, "sampling cuda graphs", True,
                lambda: checks.sampling_cuda_graphs_check(device, repeats))
    total = time.perf_counter() - report.started
    if cuda:
        report.add(Check("time budget", "PASS" if total <= BUDGET_S else "FAIL",
                         f"{total:.0f} s of {BUDGET_S:.0f}", cuda_only=True))
    else:
        report.add(Check("time budget", NO_CUDA, cuda_only=True))
    result = report.as_json()
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    counts = result["counts"]
    print(f"gpu-check on {device.type}: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
          f"{counts['not run']} not run in {total:.0f} s; report: {args.out}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
