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
import signal
import subprocess
import sys
import time
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
    assert report["complete"] is True  # (a run stopped part-way says false: below)
    # what the compiling checks need, recorded so that a GPU report's FAIL can say why
    toolchain = report["environment"]["compile_toolchain"]
    assert toolchain["ready"] and toolchain["missing"] == [], toolchain
    for check in checks.values():
        if check["cuda_only"]:
            assert check["status"].startswith("not run: no CUDA"), check
        else:
            assert check["status"] == "PASS" or check["status"] in CPU_SKIPS, check
    must_pass = {f"train {training.run_label(b, s)} {p}"
                 for b, s, p in training.QUICK_RUNS["cpu"]}
    must_pass |= {"resume fp32", "sampling static cache", "sampling half precision"}
    must_pass |= {f"attention {pattern} {dtype}" for dtype in ("fp32", "bf16")
                  for pattern in ("full", "axial_row", "axial_col", "conv_like", "sparse")}
    assert {n for n, c in checks.items() if c["status"] == "PASS"} == must_pass
    for name in ("cuda smoke", "flex recompiles", "sampling cuda graphs", "time budget",
                 "memory single bf16", "host syncs fsdp fp32", "figures train 108M bf16",
                 "hung peer", "multi torch bf16"):
        assert checks[name]["status"].startswith("not run: no CUDA"), name
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
    from dalle_dist.plan import CUDA_CONTEXT_BYTES

    rows = [{"backend": "single", "zero_stage": None, "precision": "bf16", "items": {},
             "peak": 2 * 2**30 + CUDA_CONTEXT_BYTES - training.CUBLAS_WORKSPACE_BYTES}]
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


def test_resume_verdict_within_tolerance(tmp_path: Path) -> None:
    """On a GPU whose two uninterrupted runs differ (an op without a deterministic form),
    `resume P` judges within RESUME_TOLERANCE: real phases on the CPU (worker.resume_phase,
    the `dalle-dist train` lines of the check) with the machine's noise simulated as a
    control run 1e-3 of the updates away. A correct resume passes; one whose random
    streams are not restored (the subtlest resume bug: only dropout sees it) fails; a
    control beyond the tolerance fails as too noisy to judge. The bug is made in the
    checkpoint the resume reads: its saved random streams replaced by another seed's, so
    the resumed run draws other dropout masks, as one that never restored them does."""
    import contextlib
    import io

    import torch

    from dalle_dist.checkpoint.format import write_checkpoint_file
    from dalle_dist.checkpoint.load import load_checkpoint
    from dalle_dist.checkpoint.rng import capture_rng
    from dalle_dist.selftest import resume, worker
    from dalle_dist.selftest.models import MODELS, save_fresh_vae

    vae = save_fresh_vae(MODELS["cpu"], tmp_path / "vae.pt")

    def phase(name: str, kind: str, stop_at: int | None = None) -> dict[str, torch.Tensor]:
        out = tmp_path / f"{name}.pt"
        argv = resume.train_argv(MODELS["cpu"], vae, out, "fp32", 4, 6, torch.device("cpu"),
                                 resume=kind == "resumed")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(
                io.StringIO()):
            result = worker.resume_phase({"phase": kind, "output": str(out),
                                          "stop_at": stop_at, "argv": argv})
        path = result.get("checkpoint_at_stop", result["checkpoint"])
        return load_checkpoint(path, kind, "dalle")["weights"]

    straight = phase("straight", "straight")
    at_stop = phase("good", "interrupted", stop_at=3)
    good = phase("good", "resumed")
    assert phase("bad", "interrupted", stop_at=3).keys() == at_stop.keys()
    stopped = torch.load(tmp_path / "bad.pt", weights_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)
        other = capture_rng()
    (saved,) = stopped["rng"]  # one rank's states
    assert not torch.equal(other["torch"], saved["torch"])
    write_checkpoint_file(tmp_path / "bad.pt", {**stopped, "rng": [other]})
    bad = phase("bad", "resumed")

    def control(scale: float) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        noise = {k: torch.randn(v.shape, generator=generator) for k, v in straight.items()}
        moved = sum(float((straight[k] - at_stop[k]).pow(2).sum()) for k in straight) ** 0.5
        size = sum(float(n.pow(2).sum()) for n in noise.values()) ** 0.5
        return {k: straight[k] + noise[k] * scale * moved / size for k in straight}

    assert resume.resume_verdict(straight, good, at_stop, None)[0] == "PASS"
    status, summary, details = resume.resume_verdict(straight, good, at_stop, control(1e-3))
    assert status == "PASS" and abs(details["control_error"] - 1e-3) < 1e-5, summary
    status, summary, details = resume.resume_verdict(straight, bad, at_stop, control(1e-3))
    assert status == "FAIL" and details["resume_error"] > 3 * resume.RESUME_TOLERANCE, summary
    status, summary, _ = resume.resume_verdict(straight, good, at_stop, control(0.05))
    assert status == "FAIL" and "too noisy" in summary


def test_multi_rank_verdict_from_worker_numbers(tmp_path: Path) -> None:
    """`multi B P`'s verdict, which only a machine with 2+ GPUs (or --ranks) reaches: equal
    runs pass; a first gradient norm off by the rank count (summed, not averaged) fails
    though the weights agree; weights a rank's half batch away fail though the norms
    agree."""
    import torch

    from dalle_dist.selftest import multi

    initial = {"w": torch.zeros(4)}
    want = {"w": torch.ones(4)}

    def run(norms: list[float], final: dict[str, torch.Tensor], name: str) -> dict:
        path = tmp_path / f"{name}.pt"
        torch.save({"initial": initial, "final": final}, path)
        return {"ok": True, "grad_norms": norms, "weights": str(path), "world_size": 2,
                "samples_per_s": 1.0, "matmul_dtypes": ["bfloat16"]}

    reference = run([8.0, float("inf"), 6.0], want, "reference")
    close = {"w": torch.ones(4) * 1.01}
    assert multi.multi_verdict(run([8.01, 7.0], close, "ok"), reference, "bf16")[0] == "PASS"
    status, summary, _ = multi.multi_verdict(run([16.0, 7.0], close, "sum"), reference, "bf16")
    assert status == "FAIL" and "gradient norm" in summary
    half = {"w": torch.ones(4) * 0.6}
    status, summary, _ = multi.multi_verdict(run([8.0, 7.0], half, "half"), reference, "fp16")
    assert status == "FAIL" and "weights 0.4" in summary
    assert multi.multi_world(torch.device("cpu"), None)[0] == 0
    assert multi.multi_world(torch.device("cpu"), 2) == (2, None)


def test_multi_rank_section_on_two_cpu_ranks(tmp_path: Path) -> None:
    """The multi-GPU section as a machine with 2 GPUs runs it, on 2 CPU ranks over gloo
    (--ranks 2): DDP and FSDP2 under one torchrun equal their one-process references,
    and a rank that stops itself makes the survivor print the one-line error naming its
    wait within --collective_timeout + slack. DeepSpeed's and Horovod's launch lines
    (runs.launch_line) are left to tests/backends, which launch them the same way, to
    keep this one short."""
    import torch

    from dalle_dist.selftest import multi
    from dalle_dist.selftest.report import Report

    report = Report(torch.device("cpu"), quick=True)
    multi.multi_section(report, torch.device("cpu"), False, {"bf16": 1e10, "fp16": 1e10},
                        tmp_path, ranks=2, timeout=300,
                        runs=(("torch", None, "bf16"), ("fsdp", None, "fp16")))
    checks = {c.name: c for c in report.checks}
    assert sorted(checks) == ["hung peer", "multi fsdp fp16", "multi torch bf16"]
    for check in checks.values():
        assert check.status == "PASS", (check.summary, check.details.get("tail"))
    ddp = checks["multi torch bf16"].details
    assert ddp["world_size"] == 2 and ddp["matmul_dtypes"] == ["bfloat16"]
    assert ddp["weights_error"] < multi.WEIGHTS_TOLERANCE / 10
    # per GPU: the job's FLOP/s over 2 devices' peaks
    assert ddp["mfu_per_gpu"] == pytest.approx(ddp["achieved_tflops"] * 1e12 / 2e10, rel=0.1)
    hung = checks["hung peer"].details
    # the survivor may have started its wait up to a step before the victim stopped
    assert hung["collective_timeout_s"] - 5 <= hung["after_stop_s"] <= hung["limit_s"]
    assert "rank 0 waited" in hung["line"]
    # the stopped rank is gone too (torchrun's session kill leaves it stopped, not ended)
    status = Path(f"/proc/{hung['victim_pid']}/status")
    for _ in range(100):
        if not status.exists() or "zombie" in status.read_text():
            break
        time.sleep(0.05)
    assert not status.exists() or "zombie" in status.read_text(), status.read_text()


def test_time_budget_holds_each_section_to_its_own() -> None:
    """`time budget` on a GPU: within the whole run's budget, one section over its own still
    fails (and is named); the multi section's budget is added only where it ran; the
    sections' budgets leave the start-up room inside the whole run's."""
    import dalle_dist.selftest as selftest

    for column, mode in ((0, "full"), (1, "quick")):
        single_gpu = sum(b[column] for name, b in selftest.SECTION_BUDGETS_S.items()
                         if name != "multi")
        assert single_gpu + 15 <= selftest.BUDGET_S[mode]
    fine = {"start-up": 10.0, "train": 100.0, "sampling": 50.0}
    assert selftest.budget_check(fine, 200, True, False).status == "PASS"
    slow = {**fine, "sampling": 140.0}
    check = selftest.budget_check(slow, 200, True, False)
    assert check.status == "FAIL" and "sampling 140 s of 130" in check.summary
    assert selftest.budget_check(fine, 700, True, False).status == "FAIL"
    assert selftest.budget_check(fine, 700, True, False, multi_ran=True).status == "PASS"
    assert selftest.budget_check(fine, 200, False, False).status == "not run: no CUDA"



def test_a_run_killed_part_way_keeps_the_sections_it_finished(tmp_path: Path) -> None:
    """What a job's time limit does: the installed command, killed with everything it
    launched (SIGKILL to its process group) while the train section's ranks run. The
    report holds the sections before it, marked incomplete, and no temporary file is left
    beside it. Bug caught: the report written only at the end (the first GPU run, killed
    in its last section, left none at all)."""
    out = tmp_path / "report.json"
    proc = subprocess.Popen([*DALLE_DIST, "selftest", "--device", "cpu", "--quick", "--out",
                             str(out)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # written once the smoke section ends; train runs for minutes
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    report = json.loads(out.read_text())
    assert report["complete"] is False, report
    assert [c["name"] for c in report["checks"]] == ["cuda smoke"]
    assert set(report["section_seconds"]) == {"start-up", "smoke"}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
