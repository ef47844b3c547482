"""`dalle-dist selftest`: prove a machine (one GPU, or a CPU) trains, resumes and samples
correctly with the installed dalle_dist, without a clone of its repository.

Prints one line per check (PASS, FAIL, or "not run: <why>"), writes the whole report as
JSON, and returns 1 when any check FAILs. Checks, in the order they run:

  cuda smoke        `dalle-dist check --cuda-smoke`: torch reaches every GPU
  train B P         30 optimizer steps (CPU: a few) of backend B (single, deepspeed-zero2,
                    deepspeed-zero3, fsdp; world size 1, each under its own launcher) in
                    precision P (fp32, TF32 where the run turns it on; bf16; fp16) through
                    dalle_dist's own loop: the loss falls and stays finite, the matmuls ran
                    in P's dtype; reports samples/s and MFU against the matmul peak this
                    run measures for that dtype (training.py, worker.py, mfu.py)
  memory B P        (CUDA) the step's peak allocated memory against `dalle-dist plan --json`'s
                    estimate for that row: estimate / measured within PLAN_RATIO_BAND
  host syncs B P    (CUDA) synchronizing CUDA calls per step (torch.cuda.set_sync_debug_mode),
                    on steps that neither log nor follow a logging step: 0 for our backends,
                    reported for DeepSpeed's engine (its internals are not ours)
  resume P          `dalle-dist train` stopped by SIGTERM after step k and resumed with
                    --resume auto ends with the weights of an uninterrupted run: bit for bit
                    where two uninterrupted runs are, else within a stated tolerance
                    (on CUDA the phases run deterministically; resume.py)
  attention X D     every --attn_impl path of pattern X through the attention layer, dtype D,
                    against the dense reference (fp32, TF32 off): output and gradients;
                    FlexAttention forward + backward on CUDA, forward only on the CPU
  flex recompiles   (CUDA) torch.compile builds at most one flex kernel per (pattern, shape)
  sampling static cache   the logits sampling drew each token from, through the KV cache
                          (fp32), against the uncached forward on the same prefix, within
                          a bound derived from the roundings; s/image at batch 1
  sampling half precision generate --precision: the DALL-E and its cache cast to bf16 (CUDA)
                          and fp16, the same comparison in the half dtype's bound; s/image
                          against fp32
  sampling cuda graphs    (CUDA) the compiled decode step's logits, as above; speedup
                          (sampling.py)
  multi B P         (2+ GPUs, or --ranks N) N ranks of torch DDP, FSDP2, DeepSpeed ZeRO-2
                    and Horovod equal one process at the same global batch; host syncs,
                    MFU per GPU; `hung peer`: a stopped rank ends the run with our error
                    line within --collective_timeout (multi.py)
  figures           (CUDA) training tokens/s per GPU and MFU of a ~110M-parameter model at
                    256 image tokens in bf16, and its sampling tokens/s at batch 1 and 8,
                    beside a published anchor; the same training with `train --compile`:
                    speed-up, compile time, steps until it pays off (not in --quick)
                    (figures.py)
  time budget       (CUDA) the whole run within BUDGET_S, each section within its own
                    SECTION_BUDGETS_S (the report keeps every section's seconds)

GPU sizes: DALL-E dim 512, depth 8, 8 heads x 64, 64 text + 32 x 32 = 1024 image tokens,
batch 16. CPU sizes: dim 64, depth 2, 64 image tokens, batch 4. `quick` trains each
backend once and each precision at least once, resumes in one precision, checks
attention in bf16 only, times each sampling check once, and on CUDA fits 5.5 minutes; on
the CPU (what the test suite runs) it also skips compiling FlexAttention. docs/design.md
says how the checks fit the rest.

Nothing here imports torch until a run starts: the command line must stay quick to load.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: the whole run on one GPU, start-up included, and --quick's; with 2 or more GPUs the
#: multi section's budget comes on top. The first GPU report (one H200, torch 2.11 +
#: CUDA 13.0, DeepSpeed 0.19.8; docs/gpu.md) took 311 s for --quick, most of it in
#: launcher start-ups (about 20 s each) and eager batch-1 decoding (4-5 s per
#: 1024-token image at depth 8): the issue's 4 and 8 minutes were estimates.
BUDGET_S = {"full": 630.0, "quick": 330.0}
#: the parts of a run, in the order they run
SECTIONS = ("smoke", "train", "resume", "attention", "flex", "sampling", "multi", "figures")
#: Seconds each section may take on CUDA (full, quick). --quick's: that H200 run's times
#: (smoke 9, train 89, resume 35, attention 51, flex 3, sampling 100 before its fp32
#: timing was shared and its eager warm-ups dropped, figures 20) with a margin. The full
#: run's train section measured 117 s there (12 runs, 4 launches); its other sections are
#: the quick ones scaled by their extra work (two precisions, three timed repeats, the
#: compile figure) until a full GPU report replaces them. Together they leave the process
#: start-up (imports, the matmul peaks: about 15 s) inside BUDGET_S. A launch is killed at
#: SECTION_TIMEOUT_FACTOR x its section's budget: a slow section still reports its
#: numbers, a hung one cannot eat the whole run.
SECTION_BUDGETS_S = {
    "smoke": (10, 10), "train": (130, 95), "resume": (75, 40), "attention": (100, 55),
    "flex": (40, 10), "sampling": (130, 75), "multi": (90, 45), "figures": (110, 25)}
SECTION_TIMEOUT_FACTOR, MIN_LAUNCH_TIMEOUT_S = 3, 120


def section_timeout(section: str, quick: bool) -> float:
    """How long one launch of `section` may run before it is killed."""
    return max(MIN_LAUNCH_TIMEOUT_S,
               SECTION_TIMEOUT_FACTOR * SECTION_BUDGETS_S[section][1 if quick else 0])


def run_selftest(device: str, quick: bool, out: str | Path,
                 sections: Iterable[str] = SECTIONS, ranks: int | None = None) -> int:
    """Run the checks on `device` ("cpu", "cuda", or "auto": CUDA when torch sees a GPU),
    print a line per check and a summary, write the JSON report to `out`. Returns the exit
    status: 0 every check passed or could not run here, 1 one FAILed, 2 no such device.
    `sections`: a subset of SECTIONS (all by default); `ranks`: ranks of the multi-rank
    checks (None: every GPU on CUDA, none on the CPU)."""
    import torch

    from dalle_dist.selftest.checks import attention_section, cuda_smoke_check, flex_recompile_check
    from dalle_dist.selftest.figures import figures_section
    from dalle_dist.selftest.mfu import matmul_peaks
    from dalle_dist.selftest.multi import multi_section
    from dalle_dist.selftest.report import Report, environment, guarded
    from dalle_dist.selftest.resume import resume_checks
    from dalle_dist.selftest.sampling import (
        sampling_cuda_graphs_check,
        sampling_half_precision_check,
        sampling_static_cache_check,
    )
    from dalle_dist.selftest.training import train_checks

    wanted = set(sections)
    if wanted - set(SECTIONS):
        raise ValueError(f"unknown selftest sections {sorted(wanted - set(SECTIONS))}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU (run on CPU with --device cpu, or "
              "install a CUDA build of torch: docs/gpu.md)", file=sys.stderr)
        return 2
    on = (torch.device("cuda", torch.cuda.current_device()) if device == "cuda"
          else torch.device("cpu"))
    cuda = on.type == "cuda"
    report = Report(on, quick)
    report.extra["environment"] = environment(on)
    peaks = matmul_peaks(on)
    if cuda:
        torch.cuda.empty_cache()  # the peak's matrices: the launched ranks need the memory
    report.extra["matmul_peak_gflops"] = {k: round(v / 1e9, 1) for k, v in peaks.items()}
    repeats = 1 if quick else 3
    seconds: dict[str, float] = {"start-up": round(time.perf_counter() - report.started, 1)}

    def timed(section: str, run: Callable[[], None]) -> None:
        if section in wanted:
            started = time.perf_counter()
            run()
            seconds[section] = round(time.perf_counter() - started, 1)
            # the report so far, after every section: a run killed by a job's time limit
            # (or a hung launch's parent) still leaves its verdicts and section times
            write_report(report, seconds, out, complete=False)

    def sampling() -> None:
        guarded(report, "sampling static cache", False,
                lambda: sampling_static_cache_check(on, repeats))
        # its fp32 s/image is the half-precision check's baseline: timed once
        fp32_seconds = report.checks[-1].details.get("seconds_per_image_batch_1")
        guarded(report, "sampling half precision", False,
                lambda: sampling_half_precision_check(on, repeats, fp32_seconds=fp32_seconds))
        guarded(report, "sampling cuda graphs", True,
                lambda: sampling_cuda_graphs_check(on, repeats))

    with tempfile.TemporaryDirectory(prefix="dalle-dist-selftest-") as tmp:
        folder = Path(tmp)
        timed("smoke", lambda: guarded(report, "cuda smoke", True, lambda: cuda_smoke_check(on)))
        timed("train", lambda: train_checks(report, on, quick, peaks, folder,
                                            section_timeout("train", quick)))
        timed("resume", lambda: resume_checks(report, on, quick, folder,
                                              section_timeout("resume", quick)))
        timed("attention", lambda: attention_section(report, on, quick))
        timed("flex", lambda: guarded(report, "flex recompiles", True,
                                      lambda: flex_recompile_check(on, quick)))
        timed("sampling", sampling)
        timed("multi", lambda: multi_section(report, on, quick, peaks, folder, ranks,
                                             section_timeout("multi", quick)))
        timed("figures", lambda: figures_section(report, on, peaks, folder, quick))
    multi_ran = any(c.name.startswith("multi ") and c.status in ("PASS", "FAIL")
                    for c in report.checks)
    report.add(budget_check(seconds, time.perf_counter() - report.started, cuda, quick,
                            multi_ran))
    total = time.perf_counter() - report.started
    counts = write_report(report, seconds, out, complete=True)["counts"]
    print(f"selftest on {on.type}: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
          f"{counts['not run']} not run in {total:.0f} s; report: {out}", flush=True)
    return 1 if report.failed else 0


def write_report(report: Any, seconds: dict[str, float], out: str | Path,
                 complete: bool) -> dict[str, Any]:
    """The JSON report as it stands (`complete`: false until the last check), replacing
    the last one whole: a reader never sees half a file."""
    from dalle_dist.fileio import atomic_writer

    report.extra["section_seconds"] = dict(seconds)
    report.extra["complete"] = complete
    result = report.as_json()
    with atomic_writer(out) as f:
        f.write((json.dumps(result, indent=2, default=str) + "\n").encode())
    return result


def budget_check(seconds: dict[str, float], total: float, cuda: bool, quick: bool,
                 multi_ran: bool = False) -> Any:
    """`time budget` (CUDA): the whole run within BUDGET_S (plus the multi section's budget
    where it ran) and each section within its SECTION_BUDGETS_S; the details keep every
    section's time against its budget."""
    from dalle_dist.selftest.report import NO_CUDA, Check

    if not cuda:
        return Check("time budget", NO_CUDA, details={"section_seconds": seconds},
                     cuda_only=True)
    column = 1 if quick else 0
    limit = BUDGET_S["quick" if quick else "full"] + (
        SECTION_BUDGETS_S["multi"][column] if multi_ran else 0)
    over = [f"{name} {took:.0f} s of {SECTION_BUDGETS_S[name][column]}"
            for name, took in seconds.items()
            if name in SECTION_BUDGETS_S and took > SECTION_BUDGETS_S[name][column]]
    details = {"section_seconds": seconds, "total_s": round(total, 1), "budget_s": limit,
               "section_budgets_s": {k: v[column] for k, v in SECTION_BUDGETS_S.items()}}
    status = "PASS" if total <= limit and not over else "FAIL"
    summary = f"{total:.0f} s of {limit:.0f}" + (f"; over: {', '.join(over)}" if over else "")
    return Check("time budget", status, summary, details, cuda_only=True)
