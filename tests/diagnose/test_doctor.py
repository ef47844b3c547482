"""`dalle-dist doctor` over captured-style failure logs, and its command-line contract.

Each file in logs/ is named `<expected category>__<what happened>.log`; `benign` and
`unknown` are the two result values that are not failure categories. EXPECTED_SIGNATURE
names the signature that must decide each log, so a rule that moves (or a pattern that
widens) cannot give the wrong cause and fix under the right category. The command is run
as the real `python -m dalle_dist doctor`; the rest call diagnose() directly; one test
scores all logs and prints the count per category.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dalle_dist.doctor.diagnosis import diagnose
from dalle_dist.doctor.signatures import BENIGN, CATEGORIES, SIGNATURES, UNKNOWN
from tests.conftest import assert_user_error, run_cli
from tests.diagnose import own_errors
from tests.diagnose.corpus import real_set

LOGS_DIR = Path(__file__).parent / "logs"
LOGS = sorted(LOGS_DIR.glob("*.log"))
REAL_DEV = Path(__file__).parent / "real" / "dev"
# Read while writing signatures since its blind score (issue 15): it reaches signatures too.
REAL_OUTSIDE = Path(__file__).parent / "real" / "outside"
# Read for signature round 3 after its blind score: it reaches signatures too.
REAL_HELDOUT = Path(__file__).parent / "real" / "heldout"
# Read for signature round 4 after its blind score: it reaches signatures too.
REAL_BLIND = Path(__file__).parent / "real" / "blind"
REAL_BLIND2 = Path(__file__).parent / "real" / "blind2"
JSON_KEYS = {"category", "cause", "fix", "check", "matches", "confidence", "alternatives"}
HEAVY = ("torch", "deepspeed", "horovod", "apex", "triton")
# Through the real command: a root cause among launcher noise, a benign-only log, an unknown.
CLI_LOGS = ("cuda-oom__torchrun-rank0-oom-others-timeout.log",
            "other__sigkill-root-cause-with-nccl-noise.log",
            "benign__deepspeed-fp16-early-overflows.log",
            "unknown__torchrun-childfailed-no-traceback.log")
SIGNATURE_IDS = {s.id: s for s in SIGNATURES}

#: The signature that must decide each log (None: nothing matches, category unknown).
#: Fails when a reordering or a wider pattern makes another signature decide a log, even
#: one of the same category (e.g. zero-world-size-changed read as zero-partition-missing).
EXPECTED_SIGNATURE: dict[str, str | None] = {
    "apex-missing-or-wrong__amp-c-not-built": "apex-extensions-missing",
    "apex-missing-or-wrong__cannot-import-amp": "apex-amp-missing",
    "apex-missing-or-wrong__deepspeed-amp-block": "deepspeed-amp-removed",
    "apex-missing-or-wrong__fused-layer-norm-cuda": "apex-extensions-missing",
    "apex-missing-or-wrong__megatron-no-module-apex": "apex-not-installed",
    "apex-missing-or-wrong__amp-c-undefined-symbol": "apex-extension-stale",
    "apex-missing-or-wrong__module-has-no-attribute-amp": "apex-amp-missing",
    "batch-size__captured-torchrun-cpu-odd-batch": "batch-not-divisible",
    "batch-size__dalle-dist-ds-micro-mismatch": "batch-not-divisible",
    "batch-size__dalle-dist-global-batch": "batch-not-divisible",
    "batch-size__dataset-too-small": "batch-larger-than-data",
    "batch-size__deepspeed-check-batch-assertion": "batch-not-divisible",
    "batch-size__ds-startup-warnings-then-assert": "batch-not-divisible",
    "batch-size__ga-steps-not-divisible": "batch-not-divisible",
    "benign__apex-early-gradient-overflow": "apex-gradient-overflow",
    "benign__apex-python-fallback": "apex-python-fallback",
    "benign__dalle-dist-amp-fallback": "dalle-dist-amp-fallback",
    "benign__deepspeed-cuda-minor-mismatch-accepted": "ds-cuda-minor-mismatch-accepted",
    "benign__deepspeed-fp16-early-overflows": "ds-overflow-skip",
    "benign__deepspeed-hysteresis": "ds-overflow-skip",
    "benign__megatron-apex-fallback-notice": "apex-optional-missing",
    "benign__torchrun-omp-notice": "torchrun-omp-threads",
    "cuda-oom__deepspeed-fp16-overflow-then-oom": "cuda-out-of-memory",
    "cuda-oom__generate-large-batch": "cuda-out-of-memory",
    "cuda-oom__nccl-cuda-failure-out-of-memory": "cuda-out-of-memory",
    "cuda-oom__old-runtimeerror-format": "cuda-out-of-memory",
    "cuda-oom__single-gpu-new-format": "cuda-out-of-memory",
    "cuda-oom__torchrun-rank0-oom-others-timeout": "cuda-out-of-memory",
    "cuda-unavailable-or-mismatch__bf16-on-v100": "bf16-unsupported",
    "cuda-unavailable-or-mismatch__captured-deepspeed-fp16-cpu": "fp16-without-gpu",
    "cuda-unavailable-or-mismatch__cuda-unknown-error-init": "no-gpu-visible",
    "cuda-unavailable-or-mismatch__deepspeed-fp16-on-cpu": "fp16-without-gpu",
    "cuda-unavailable-or-mismatch__driver-too-old": "nvidia-driver-too-old",
    "cuda-unavailable-or-mismatch__horovod-mpi-lib-libcudart": "libcudart-missing",
    "cuda-unavailable-or-mismatch__nccl-no-gpus": "no-gpu-visible",
    "cuda-unavailable-or-mismatch__no-kernel-image": "gpu-arch-unsupported",
    "cuda-unavailable-or-mismatch__no-nvidia-driver": "nvidia-driver-missing",
    "cuda-unavailable-or-mismatch__torch-cpu-build": "torch-cpu-build",
    "cuda-unavailable-or-mismatch__torchrun-ranks-libcudart-ctypes": "libcudart-missing",
    "deepspeed-missing__convert-zero-checkpoint": "deepspeed-not-installed",
    "deepspeed-missing__dalle-dist-backend-not-importable": "deepspeed-not-installed",
    "deepspeed-missing__launcher-command-not-found": "deepspeed-not-installed",
    "deepspeed-missing__train-script-import": "deepspeed-not-installed",
    "deepspeed-op-build__cuda-home-missing": "ds-cuda-home-missing",
    "deepspeed-op-build__cuda-toolkit-mismatch": "ds-cuda-toolkit-mismatch",
    "deepspeed-op-build__fused-adam-unsupported-arch": "ds-op-build-failed",
    "deepspeed-op-build__ninja-missing": "ds-ninja-missing",
    "deepspeed-op-build__pip-ds-build-ops-wheel": "ds-op-build-failed",
    "fp16-overflow__anomaly-nan-in-backward": "fp16-nan-loss",
    "fp16-overflow__apex-loss-scale-collapse": "apex-loss-scale-collapse",
    "fp16-overflow__dalle-pytorch-nan-fp16": "fp16-nan-loss",
    "fp16-overflow__ds-loss-scale-at-minimum": "ds-loss-scale-at-minimum",
    "fp16-overflow__nan-loss-torchrun-fp16": "fp16-nan-loss",
    "horovod-not-built__dalle-dist-backend-unavailable": "horovod-torch-extension",
    "horovod-not-built__extension-not-built": "horovod-torch-extension",
    "horovod-not-built__gloo-not-built": "horovod-transport-missing",
    "horovod-not-built__no-module-horovod": "horovod-not-installed",
    "horovod-not-built__pip-build-cxx17": "horovod-build-failed",
    "launcher-args__captured-torchrun-port-taken": "port-in-use",
    "launcher-args__env-rendezvous-rank-not-set": "no-launcher-environment",
    "launcher-args__invalid-precision-choice": "bad-arguments",
    "launcher-args__local-rank-unrecognized": "local-rank-unrecognized",
    "launcher-args__no-launcher-environment": "no-launcher-environment",
    "launcher-args__port-in-use": "port-in-use",
    "launcher-args__torchrun-missing-script": "bad-arguments",
    "launcher-args__unknown-backend": "bad-arguments",
    "nccl-comm__captured-deepspeed-killed-root": "dalle-dist-peer-lost",
    "nccl-comm__captured-horovodrun-stopped-coordinator": "dalle-dist-peer-lost",
    "nccl-comm__captured-torchrun-stopped-peer": "dalle-dist-peer-lost",
    "nccl-comm__duplicate-gpu": "nccl-duplicate-gpu",
    "nccl-comm__gloo-recv-timeout-ddp-sync-params": "gloo-timeout",
    "nccl-comm__gloo-recv-timeout-pipeline-ranks-blocked": "gloo-timeout",
    "nccl-comm__heartbeat-monitor-timed-out-process-stuck": "collective-timeout",
    "nccl-comm__horovod-shut-down-peer-finished-early-stopping": "horovod-shut-down",
    "nccl-comm__horovod-stall-broadcast-vs-allreduce-gpus-idle": "horovod-stall",
    "nccl-comm__horovod-stall-partial-fc-100k-iters": "horovod-stall",
    "nccl-comm__remote-error-single": "collective-timeout",
    "nccl-comm__store-client-socket-timeout": "nccl-network",
    "nccl-comm__unhandled-system-error-two-nodes": "nccl-network",
    "nccl-comm__watchdog-allreduce-stuck-second-epoch": "collective-timeout",
    "nccl-comm__watchdog-alltoall-hang-epoch-transition": "collective-timeout",
    "nccl-comm__watchdog-timeout-only": "collective-timeout",
    "other__captured-train-compile-no-python-headers": "python-headers-missing",
    "other__dataset-missing": "dalle-dist-error",
    "other__disk-full-checkpoint": "disk-full",
    "other__host-oom-sigkill": "host-oom-killed",
    "other__nan-loss-fp32": "nan-loss",
    "other__sigkill-root-cause-with-nccl-noise": "host-oom-killed",
    "other__unsafe-pickled-checkpoint": "dalle-dist-error",
    "sparse-attn-triton__deepspeed-sparse-attention-removed": "ds-sparse-attention-unavailable",
    "sparse-attn-triton__ds-report-sparse-incompatible": "ds-sparse-attention-unavailable",
    "sparse-attn-triton__no-module-triton": "triton-missing",
    "sparse-attn-triton__triton-no-attribute-kernel": "triton-api-mismatch",
    "unknown__clean-successful-run": None,
    "unknown__keyerror-custom-dataset": None,
    "unknown__pil-unidentified-image": None,
    "unknown__segfault-no-message": None,
    "unknown__torchrun-childfailed-no-traceback": None,
    "zero-checkpoint__dalle-dist-partitions-world-size": "zero-world-size-changed",
    "zero-checkpoint__dp-world-size-changed": "zero-world-size-changed",
    "zero-checkpoint__no-latest-file": "zero-partition-missing",
    "zero-checkpoint__optim-states-file-missing": "zero-partition-missing",
    "zero-checkpoint__zero-to-fp32-expected-files": "zero-partition-missing",
}
#: Signatures that decide no log yet (written or real), and why.
UNREACHED = {
    "deepspeed-version-pin": "issue 15's version-pin shape; no pasted pin error found in the "
                             "dev repositories yet",
    "torch-ext-cuda-mismatch": "torch's extension-builder wording, from its source; no real "
                               "log yet (test_doctor_real's wordings test reads it)",
    "apex-build-cuda-mismatch": "Apex setup.py's wording, from its source; no real log yet "
                                "(test_doctor_real's wordings test reads it)",
}

# The real `dalle-dist` in a fresh process, reporting the heavy modules it loaded while
# running ARGS: those loaded after `import dalle_dist.cli` (which brings torch for other
# commands), engines at any time.
HEAVY_PROBE = """
import sys

import dalle_dist.cli

baseline = {m for m in sys.modules if m.split(".")[0] == "torch"}
try:
    status = dalle_dist.cli.main(sys.argv[1:])
finally:
    loaded = sorted({m.split(".")[0] for m in set(sys.modules) - baseline} & {HEAVY})
    print("HEAVY", loaded, file=sys.stderr)
raise SystemExit(status)
""".replace("{HEAVY}", repr(set(HEAVY)))


def expected(log: Path) -> str:
    return log.name.split("__", 1)[0]


def doctor(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m dalle_dist doctor ARGS`, as a user runs it."""
    if stdin is None:
        return run_cli("doctor", *args, cwd=LOGS_DIR.parent, timeout=120)
    return subprocess.run([sys.executable, "-m", "dalle_dist", "doctor", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=LOGS_DIR.parent)


# -- the logs -----------------------------------------------------------------------------

def test_logs_cover_every_category() -> None:
    counts = Counter(expected(log) for log in LOGS)
    assert len(LOGS) >= 45
    assert set(counts) <= {*CATEGORIES, BENIGN, UNKNOWN}, set(counts) - {*CATEGORIES, BENIGN,
                                                                         UNKNOWN}
    assert all(counts[c] >= 3 for c in (*CATEGORIES, BENIGN, UNKNOWN)), counts
    for log in LOGS:
        assert len(log.read_text().splitlines()) >= 2, f"{log.name}: a log is not one line"


def test_every_log_names_its_signature() -> None:
    """A new log must say which signature decides it; the names must agree with the file's
    category (fails on a log added without an entry, or an entry left for a removed log)."""
    assert set(EXPECTED_SIGNATURE) == {log.stem for log in LOGS}
    for log in LOGS:
        signature = EXPECTED_SIGNATURE[log.stem]
        if expected(log) == UNKNOWN:
            assert signature is None, log.name
        else:
            assert SIGNATURE_IDS[signature].category == expected(log), log.name


def test_every_signature_decides_a_log() -> None:
    """A signature no log reaches is knowledge nothing checks (fails when a log is removed,
    or a signature is added, without a written, real dev or real outside log that it
    decides, or a real heldout log since round 3 read it, a real blind log since round 4
    read it, or a real blind2 log since round 5 read it)."""
    reached = set(EXPECTED_SIGNATURE.values())
    for real in (REAL_DEV, REAL_OUTSIDE, REAL_HELDOUT, REAL_BLIND, REAL_BLIND2):
        reached |= {diagnose(case.text).signature for case in real_set(real)}
    assert set(SIGNATURE_IDS) - reached == set(UNREACHED)


@pytest.mark.parametrize("log", LOGS, ids=lambda log: log.stem)
def test_category_and_signature(log: Path) -> None:
    """Fails when another signature decides the log (reordered rules, a widened pattern),
    even under the right category, or when a pattern no longer matches its real log."""
    text = log.read_text()
    diagnosis = diagnose(text)
    assert (diagnosis.category, diagnosis.signature) == (
        expected(log), EXPECTED_SIGNATURE[log.stem]), diagnosis.matches
    lines = text.splitlines()
    if diagnosis.category == UNKNOWN:
        assert diagnosis.matches == () and diagnosis.signature is None
    else:
        assert diagnosis.matches, "a diagnosis shows the lines it rests on"
        for match in diagnosis.matches:
            assert lines[match.line - 1].strip() == match.text
    for field in (diagnosis.cause, diagnosis.fix, diagnosis.check):
        assert field and not re.search(r"\{\w+\}", field), field  # placeholders all filled


def test_accuracy_over_all_logs(capsys: pytest.CaptureFixture[str]) -> None:
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    wrong = []
    for log in LOGS:
        diagnosis = diagnose(log.read_text())
        got = (diagnosis.category, diagnosis.signature)
        total[expected(log)] += 1
        if got == (expected(log), EXPECTED_SIGNATURE[log.stem]):
            right[expected(log)] += 1
        else:
            wrong.append(f"{log.name} -> {got}")
    accuracy = sum(right.values()) / len(LOGS)
    table = "\n".join(f"  {c:30s} {right[c]:3d}/{total[c]:<3d}" for c in sorted(total))
    with capsys.disabled():
        print(f"\ndoctor accuracy (category and signature) {accuracy:.3f} over {len(LOGS)} "
              f"logs\n{table}")
    assert accuracy == 1.0, wrong


# -- the rule --------------------------------------------------------------------------------

SPARSE_WARNING = (" [WARNING]  sparse_attn requires a torch version >= 1.5 and < 2.0 but "
                  "detected 2.1")
BATCH_ASSERT = ("AssertionError: Check batch related parameters. train_batch_size is not equal "
                "to micro_batch_per_gpu * gradient_acc_step * world_size 8 != 4 * 1 * 4")


@pytest.mark.parametrize("lines", [(SPARSE_WARNING, BATCH_ASSERT), (BATCH_ASSERT, SPARSE_WARNING)])
def test_exception_line_beats_a_warning_listed_earlier(lines: tuple[str, str]) -> None:
    """sparse-attn-triton comes first in SIGNATURES, but the raised line is the cause."""
    diagnosis = diagnose("\n".join(lines))
    assert diagnosis.category == "batch-size"
    assert [m.text for m in diagnosis.matches] == [BATCH_ASSERT.strip()]
    assert diagnose(SPARSE_WARNING).category == "sparse-attn-triton"


def test_root_cause_section_beats_other_ranks_exceptions() -> None:
    log = (LOGS_DIR / "other__sigkill-root-cause-with-nccl-noise.log").read_text()
    assert "ncclRemoteError" in log
    without_root = log[:log.index("Root Cause")]
    assert diagnose(without_root).category == "nccl-comm"  # what the rest would say
    assert diagnose(log).category == "other"


def test_follow_on_symptoms_lose_to_the_root_cause() -> None:
    """Ordering: a rank's OOM before the NCCL errors it causes on the others."""
    oom = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. "
           "GPU 0 has a total capacity of 39.39 GiB of which 412.19 MiB is free.")
    remote = ("[rank1]: ncclRemoteError: A call failed possibly due to a network error or a "
              "remote process exiting prematurely.")
    for text in (f"{oom}\n{remote}", f"{remote}\n{oom}"):
        diagnosis = diagnose(text)
        assert diagnosis.category == "cuda-oom"
        assert diagnosis.cause == "a GPU ran out of memory"


def test_a_shared_line_is_read_by_the_first_signature() -> None:
    fallback = ("Warning:  multi_tensor_applier fused unscale kernel is unavailable, possibly "
                "because apex was installed without --cuda_ext --cpp_ext. Using Python "
                "fallback.  Original ImportError was: ModuleNotFoundError(\"No module named "
                "'amp_C'\")")
    assert diagnose(fallback).category == BENIGN
    assert diagnose("ModuleNotFoundError: No module named 'amp_C'").category == \
        "apex-missing-or-wrong"
    early = ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, "
             "reducing to 32768")
    floor = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1"
    assert diagnose(early).category == BENIGN
    assert diagnose(f"{early}\n{floor}").category == "fp16-overflow"


def test_benign_notes_ride_along_with_a_failure() -> None:
    diagnosis = diagnose((LOGS_DIR / "cuda-oom__deepspeed-fp16-overflow-then-oom.log")
                         .read_text())
    assert diagnosis.category == "cuda-oom"
    assert any("loss scaler" in note for note in diagnosis.benign)
    assert all("OVERFLOW" not in m.text for m in diagnosis.matches)


def test_nan_loss_is_fp16_only_with_fp16_on() -> None:
    bar = "DALL-E epoch 0:  45%|████▌     | 900/2000 [07:30<09:10,  2.00step/s, loss=nan]"
    assert diagnose(bar).category == "other"
    assert diagnose(f"$ dalle-dist train --precision fp16\n{bar}").category == "fp16-overflow"
    assert diagnose(bar.replace("loss=nan", "loss=5.874")).category == UNKNOWN


def test_named_groups_fill_the_cause() -> None:
    diagnosis = diagnose((LOGS_DIR / "zero-checkpoint__dp-world-size-changed.log").read_text())
    assert diagnosis.cause.startswith("the ZeRO checkpoint was saved by 8 ranks and this run "
                                      "has 4")
    assert diagnosis.fix.startswith("resume with 8 ranks")


def test_dalle_dist_error_lines_carry_their_own_fix() -> None:
    diagnosis = diagnose("$ dalle-dist train --image_text_folder /nope\nerror: "
                         "--image_text_folder /nope does not exist (check the path)")
    assert diagnosis.category == "other"
    assert diagnosis.cause == "dalle-dist stopped: --image_text_folder /nope does not exist"
    assert diagnosis.fix == "check the path"


def test_nothing_known_is_unknown_not_a_guess() -> None:
    for text in ("", "\n\n", "Segmentation fault (core dumped)\n",
                 "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                 "ZeroDivisionError: division by zero\n"):
        diagnosis = diagnose(text)
        assert diagnosis.category == UNKNOWN and diagnosis.matches == ()


def test_signatures_are_well_formed() -> None:
    ids = [s.id for s in SIGNATURES]
    assert len(ids) == len(set(ids))
    assert {s.category for s in SIGNATURES if not s.benign} == set(CATEGORIES)
    for s in SIGNATURES:
        assert (s.category == BENIGN) == s.benign, s.id
        assert s.patterns and s.cause and s.fix and s.check, s.id
        used = set(re.findall(r"\{(\w+)\}", s.cause + s.fix + s.check))
        for pattern in s.patterns:
            groups = set(re.compile(pattern).groupindex)
            assert used <= groups, f"{s.id}: {pattern} does not fill {used - groups}"
        for pattern in (*s.patterns, *s.requires):
            re.compile(pattern)
            assert r"\n" not in pattern.replace(r"[^\n]", ""), f"{s.id}: spans lines"


def test_doctor_modules_import_no_torch() -> None:
    probe = ("import sys\nfrom dalle_dist.doctor.diagnosis import diagnose\n"
             "diagnose(open(sys.argv[1]).read())\n"
             f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    log = LOGS_DIR / "cuda-oom__single-gpu-new-format.log"
    result = subprocess.run([sys.executable, "-c", probe, str(log)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the command -------------------------------------------------------------------------------
# Every test here fails if `doctor` is not registered in dalle_dist/cli/__init__.py.

@pytest.mark.parametrize("name", CLI_LOGS)
def test_cli_json(name: str) -> None:
    log = LOGS_DIR / name
    result = doctor(str(log), "--json")
    status = 1 if expected(log) == UNKNOWN else 0
    assert result.returncode == status, result.stderr
    payload = json.loads(result.stdout)
    assert set(payload) == JSON_KEYS
    assert payload["category"] == expected(log)
    assert all(isinstance(payload[k], str) for k in ("category", "cause", "fix", "check"))
    assert all(isinstance(x, str) for x in payload["matches"])
    assert bool(payload["matches"]) == (expected(log) != UNKNOWN)
    confidence = payload["confidence"]
    assert isinstance(confidence, float) and 0.0 <= confidence <= 1.0
    assert (confidence == 0.0) == (expected(log) == UNKNOWN)
    assert len(payload["alternatives"]) <= 2
    for alternative in payload["alternatives"]:
        assert set(alternative) == {"category", "line"}
        assert alternative["category"] in CATEGORIES
        assert alternative["category"] != payload["category"]
    signature = EXPECTED_SIGNATURE[log.stem]
    if signature is not None and expected(log) != BENIGN:
        assert payload["cause"] == SIGNATURE_IDS[signature].cause


def test_cli_loads_no_engine() -> None:
    """doctor reads a log only: no engine, no torch module beyond what the CLI imports
    anyway (fails if run_doctor, diagnose or signatures import torch or an engine)."""
    log = LOGS_DIR / "cuda-oom__torchrun-rank0-oom-others-timeout.log"
    result = subprocess.run([sys.executable, "-c", HEAVY_PROBE, "doctor", str(log), "--json"],
                            capture_output=True, text=True, timeout=120, check=False)
    heavy = [x for x in result.stderr.splitlines() if x.startswith("HEAVY ")]
    assert heavy == ["HEAVY []"], result.stderr
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["category"] == "cuda-oom"


def test_cli_human_output_names_cause_fix_check_and_lines() -> None:
    log = LOGS_DIR / "cuda-oom__torchrun-rank0-oom-others-timeout.log"
    result = doctor(str(log))
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "category: cuda-oom"
    assert [line.split(":")[0] for line in out[1:6]] == ["cause", "fix", "check", "confidence",
                                                         "matched"]
    assert any("torch.OutOfMemoryError: CUDA out of memory" in line for line in out[5:])
    assert any(line.startswith("harmless warnings also seen:") for line in out)


@pytest.mark.parametrize("args", [("-",), ()], ids=["dash", "no-argument"])
def test_cli_reads_stdin(args: tuple[str, ...]) -> None:
    text = (LOGS_DIR / "zero-checkpoint__dp-world-size-changed.log").read_text()
    result = doctor(*args, "--json", stdin=text)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["category"] == "zero-checkpoint"


def test_cli_unknown_exits_1() -> None:
    result = doctor("-", stdin="all good\n")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("category: unknown\n")


@pytest.mark.parametrize("target", ["missing.log", "logs"], ids=["missing", "directory"])
def test_cli_unreadable_logfile_is_one_error_line(target: str) -> None:
    result = doctor(target)
    assert_user_error(result, f"error: LOGFILE {target} ")
    assert result.stdout == ""


# -- dalle-dist's own error lines --------------------------------------------------------------

def test_own_error_expectations_name_real_tests() -> None:
    """Every entry of own_errors.EXPECTED_SIGNATURE names an existing test function and a
    known signature (fails when a listed test is renamed and its check silently lapses)."""
    root = Path(__file__).resolve().parents[2]
    assert own_errors.EXPECTED_SIGNATURE
    for nodeid, signature in own_errors.EXPECTED_SIGNATURE.items():
        assert signature in SIGNATURE_IDS, nodeid
        test, _, param = nodeid.partition("[")
        path, function = test.split("::")
        source = (root / path).read_text()
        assert re.search(rf"^def {function}\(", source, re.MULTILINE), nodeid
        # A parametrization's id is built from its values or ids=: each part is in the file.
        assert all(part in source for part in param.rstrip("]").split("-")), nodeid


@pytest.mark.parametrize(("nodeid", "line", "signature"), [
    ("tests/backends/test_errors.py::test_batch_that_cannot_be_split[torch-1-x]",
     "error: --batch_size 1 is the global batch of backend torch and must be a multiple of "
     "the 2 ranks (use --batch_size 2 or 4)", "batch-not-divisible"),
    ("tests/backends/test_errors.py::test_batch_that_cannot_be_split[torch-1-x]",
     "error: --batch_size 1 must divide evenly over the 2 ranks (use --batch_size 2 or 4)",
     None),
])
def test_check_doctor_reads_catches_a_reworded_message(
        nodeid: str, line: str, signature: str | None) -> None:
    """The check assert_user_error runs, for that test's entry: the listed signature
    passes; the same error reworded so that no pattern matches (doctor falls back to
    dalle-dist-error) fails."""
    expected = own_errors.expected_signature(nodeid)
    assert expected == "batch-not-divisible"
    if signature is not None:
        assert own_errors.judge(line, diagnose(line), expected).signature == signature
    else:
        with pytest.raises(AssertionError, match="batch-not-divisible"):
            own_errors.judge(line, diagnose(line), expected)


@pytest.mark.parametrize("line", [
    "error: --dim must be >= 1, got 0",  # no fix: recorded, not judged
    "error: --text is empty (give a prompt, e.g. --text 'a red circle')",
])
def test_check_doctor_reads_accepts_generic_errors(line: str) -> None:
    """Fails if the check judges more than it should: an error without a fix (unknown to
    doctor) or without a signature of its own must not fail the test that printed it."""
    diagnosis = own_errors.check_doctor_reads(line)
    assert diagnosis.category in (UNKNOWN, "other")


def test_check_doctor_reads_refuses_an_unrecognised_design_line() -> None:
    """A line in docs/design.md's `error: what (fix)` shape that doctor reads as unknown (its
    generic pattern broken) or as harmless must fail the test that printed it. doctor's
    real readings of other text stand in for the broken ones: no pattern is patched."""
    line = "error: --text is empty (give a prompt)"
    for reading in (diagnose("nothing to see"),
                    diagnose("[deepspeed] OVERFLOW! Rank 0 Skipping step")):
        assert reading.category in (UNKNOWN, BENIGN)
        with pytest.raises(AssertionError):
            own_errors.judge(line, reading, None)
    assert own_errors.judge(line, diagnose(line), None).signature == "dalle-dist-error"
