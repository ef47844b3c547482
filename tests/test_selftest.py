"""`dalle-dist selftest` cannot rot: its --device cpu --quick form runs here, as a user runs
the installed command (the venv's console script, from a folder outside the repository),
in real processes (DeepSpeed's launcher, torchrun), and every check that can run on a CPU
passes while every CUDA-only one says "not run: no CUDA".

Seen failing, each with a scratch bug in the library (and the run exiting 1):
- conv_like's band gather one grid row short (attention.py rows_back = reach - 1):
  "attention conv_like fp32/bf16" FAIL;
- restore_training not restoring the RNG states: "resume fp32" FAIL (the resume check
  trains with dropout so the random streams decide the weights);
- Precision.autocast entering no autocast: "train single bf16" FAIL (matmuls in float32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dalle_dist.selftest import training

#: The installed command, as pip puts it beside the venv's Python (else the same entry
#: point through the module).
SCRIPT = Path(sys.executable).parent / "dalle-dist"
DALLE_DIST = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "dalle_dist"]

#: Why a check that is not CUDA-only may skip on the CPU with --quick.
CPU_SKIPS = {"not run: --quick", "not run: DeepSpeed cannot train fp16 on CPU"}


@pytest.fixture(scope="module")
def quick_cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("selftest") / "report.json"
    # One thread: the launched ranks share this machine's cores with the main process.
    result = subprocess.run([*DALLE_DIST, "selftest", "--device", "cpu", "--quick",
                             "--out", str(out)],
                            capture_output=True, text=True, timeout=540,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=out.parent)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(out.read_text()), result.stdout


def test_quick_cpu_run_passes_every_cpu_check(quick_cpu_run: tuple[dict, str]) -> None:
    report, stdout = quick_cpu_run
    checks = {c["name"]: c for c in report["checks"]}
    assert report["device"] == "cpu" and report["passed"] and report["counts"]["FAIL"] == 0
    for check in checks.values():
        if check["cuda_only"]:
            assert check["status"] == "not run: no CUDA", check
        else:
            assert check["status"] == "PASS" or check["status"] in CPU_SKIPS, check
    must_pass = {f"train {training.run_label(b, s)} {p}"
                 for b, s, p in training.QUICK_RUNS}
    must_pass |= {"resume fp32", "sampling static cache", "sampling half precision"}
    must_pass |= {f"attention {pattern} {dtype}" for dtype in ("fp32", "bf16")
                  for pattern in ("full", "axial_row", "axial_col", "conv_like", "sparse")}
    assert {n for n, c in checks.items() if c["status"] == "PASS"} == must_pass
    for name in ("cuda smoke", "flex recompiles", "sampling cuda graphs", "time budget",
                 "memory single bf16", "host syncs fsdp fp32"):
        assert checks[name]["status"] == "not run: no CUDA"
    # one printed line per check, in the order of the report
    lines = [line for line in stdout.splitlines() if line.split(" ", 1)[0]
             in ("PASS", "FAIL", "not")]
    assert len(lines) == len(checks)
    assert stdout.splitlines()[-1].startswith("selftest on cpu: ")


def test_training_checks_report_real_numbers(quick_cpu_run: tuple[dict, str]) -> None:
    """What the GPU report is read for: throughput, MFU against the measured fp32 peak,
    a loss that fell, the precision's dtype in the matmuls, and weights equal on resume."""
    report, _ = quick_cpu_run
    checks = {c["name"]: c for c in report["checks"]}
    assert report["matmul_peak_gflops"]["fp32"] > 0
    fp32 = checks["train single fp32"]["details"]
    assert fp32["samples_per_s"] > 0 and 0 < fp32["mfu"] < 1
    assert fp32["matmul_dtypes"] == ["float32"]
    assert "bfloat16" in checks["train deepspeed-zero2 bf16"]["details"]["matmul_dtypes"]
    assert checks["resume fp32"]["details"]["max_abs_diff"] == 0.0
    half = checks["sampling half precision"]["details"]
    assert 0 <= half["float16"]["cached_vs_uncached_rel_err"] <= half["float16"]["bound"]
    assert half["float16"]["seconds_per_image"] > 0 and half["seconds_per_image_fp32"] > 0


def test_plan_has_a_row_for_every_training_check() -> None:
    """The memory check reads `dalle-dist plan --json`'s row of each backend, ZeRO stage and
    precision it trains; a run the plan does not list would FAIL on the GPU only."""
    from dalle_dist.backends.precision_kinds import PRECISIONS

    batch = training.TRAIN_SIZES["cuda"][0]
    rows = training.plan_rows(training.MODELS["cuda"], batch, 80 * 2**30)
    keys = {(r["backend"], r["zero_stage"], r["precision"]) for r in rows}
    for backend, stage in training.RUNS:
        for precision in PRECISIONS:
            assert (backend, stage, precision) in keys
    assert all(r["micro_batch"] == batch for r in rows if r["backend"] != "horovod")


def test_gpu_only_verdicts_from_worker_numbers() -> None:
    """The memory and host-sync verdicts, which only a GPU run reaches, from the numbers a
    worker reports: a plan off by more than the band fails, a sync on a quiet step fails
    our backends and is only reported for DeepSpeed's engine."""
    rows = [{"backend": "single", "zero_stage": None, "precision": "bf16", "items": {},
             "peak": 2 * 2**30 + 512 * 2**20}]
    out = {"ok": True, "peak_bytes": 2 * 2**30}
    check = training.memory_check("single bf16", out, rows, "single", None, "bf16", True)
    assert check.status == "PASS" and check.details["ratio"] == 1.0
    out["peak_bytes"] = 3 * 2**30
    check = training.memory_check("single bf16", out, rows, "single", None, "bf16", True)
    assert check.status == "FAIL"
    syncs = {"ok": True, "syncs_by_step": {}, "syncs_quiet_step_max": 1,
             "syncs_quiet_step_median": 0}
    assert training.sync_check("x", syncs, "fsdp", True).status == "FAIL"
    assert training.sync_check("x", syncs, "deepspeed", True).status == "PASS"
    syncs["syncs_quiet_step_max"] = 0
    assert training.sync_check("x", syncs, "single", True).status == "PASS"
