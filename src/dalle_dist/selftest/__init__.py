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
                    --resume auto ends with the weights of an uninterrupted run (on CUDA, at
                    least as close as two uninterrupted runs are to each other) (resume.py)
  attention X D     every --attn_impl path of pattern X through the attention layer, dtype D,
                    against the dense reference (fp32, TF32 off): output and gradients;
                    FlexAttention forward + backward on CUDA, forward only on the CPU
  flex recompiles   (CUDA) torch.compile builds at most one flex kernel per (pattern, shape)
  sampling static cache   cached == uncached sampling, token for token; s/image at batch 1
  sampling half precision generate --precision: the DALL-E cast to bf16 (CUDA) and fp16
                          decodes through its cache within rounding of the uncached
                          forward; s/image against fp32 (sampling.py)
  sampling cuda graphs    (CUDA) the compiled decode step: same tokens, s/image, speedup
  time budget       (CUDA) the whole run took at most BUDGET_S seconds

GPU sizes: DALL-E dim 512, depth 8, 8 heads x 64, 64 text + 32 x 32 = 1024 image tokens,
batch 16. CPU sizes: dim 64, depth 2, 64 image tokens, batch 4. `quick` (what the test
suite runs on the CPU) trains each backend in one precision (single in all three) and
skips compiling FlexAttention on the CPU. docs/design.md says how the checks fit the rest.

Nothing here imports torch until a run starts: the command line must stay quick to load.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

#: the whole run on one GPU (issue 13: at most 8 minutes)
BUDGET_S = 480.0
#: the parts of a run, in the order they run
SECTIONS = ("smoke", "train", "resume", "attention", "flex", "sampling")


def run_selftest(device: str, quick: bool, out: str | Path,
                 sections: Iterable[str] = SECTIONS) -> int:
    """Run the checks on `device` ("cpu", "cuda", or "auto": CUDA when torch sees a GPU),
    print a line per check and a summary, write the JSON report to `out`. Returns the exit
    status: 0 every check passed or could not run here, 1 one FAILed, 2 no such device.
    `sections`: a subset of SECTIONS (all by default)."""
    import torch

    from dalle_dist.selftest.checks import attention_section, cuda_smoke_check, flex_recompile_check
    from dalle_dist.selftest.mfu import matmul_peaks
    from dalle_dist.selftest.report import NO_CUDA, Check, Report, environment, guarded
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
    repeats = 3 if cuda or not quick else 1
    with tempfile.TemporaryDirectory(prefix="dalle-dist-selftest-") as tmp:
        folder = Path(tmp)
        if "smoke" in wanted:
            guarded(report, "cuda smoke", True, lambda: cuda_smoke_check(on))
        if "train" in wanted:
            train_checks(report, on, quick, peaks, folder)
        if "resume" in wanted:
            resume_checks(report, on, quick, folder)
    if "attention" in wanted:
        attention_section(report, on, quick)
    if "flex" in wanted:
        guarded(report, "flex recompiles", True, lambda: flex_recompile_check(on))
    if "sampling" in wanted:
        guarded(report, "sampling static cache", False,
                lambda: sampling_static_cache_check(on, repeats))
        guarded(report, "sampling half precision", False,
                lambda: sampling_half_precision_check(on, repeats))
        guarded(report, "sampling cuda graphs", True,
                lambda: sampling_cuda_graphs_check(on, repeats))
    total = time.perf_counter() - report.started
    if cuda:
        report.add(Check("time budget", "PASS" if total <= BUDGET_S else "FAIL",
                         f"{total:.0f} s of {BUDGET_S:.0f}", cuda_only=True))
    else:
        report.add(Check("time budget", NO_CUDA, cuda_only=True))
    result = report.as_json()
    Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    counts = result["counts"]
    print(f"selftest on {on.type}: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
          f"{counts['not run']} not run in {total:.0f} s; report: {out}", flush=True)
    return 1 if report.failed else 0
