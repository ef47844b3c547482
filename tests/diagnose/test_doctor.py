"""`dalle-dist doctor` over captured-style failure logs, and its command-line contract.

Each file in logs/ is named `<expected category>__<what happened>.log`; `benign` and
`unknown` are the two result values that are not failure categories. A few logs go
through the real command in a subprocess; the rest call diagnose() directly; one test
scores all of them and prints the count per category.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dalle_dist.diagnose.doctor import diagnose
from dalle_dist.diagnose.signatures import BENIGN, CATEGORIES, SIGNATURES, UNKNOWN

LOGS_DIR = Path(__file__).parent / "logs"
LOGS = sorted(LOGS_DIR.glob("*.log"))
JSON_KEYS = {"category", "cause", "fix", "check", "matches"}
HEAVY = ("torch", "deepspeed", "horovod", "apex", "triton")
# Through the real command: a root cause among launcher noise, a benign-only log, an unknown.
CLI_LOGS = ("cuda-oom__torchrun-rank0-oom-others-timeout.log",
            "other__sigkill-root-cause-with-nccl-noise.log",
            "benign__deepspeed-fp16-early-overflows.log",
            "unknown__torchrun-childfailed-no-traceback.log")

# `dalle-dist doctor ARGS` as cli/__init__.py runs it, on a parser holding only doctor.
# HEAVY lists the heavy modules doctor itself loaded: those loaded after the import of
# the cli package (which may bring torch for other commands), engines at any time.
RUN_DOCTOR = """
import argparse
import sys

import dalle_dist.cli

baseline = {m for m in sys.modules if m.split(".")[0] == "torch"}
from dalle_dist.cli.doctor_cmd import add_doctor
from dalle_dist.errors import DalleDistError

parser = argparse.ArgumentParser(prog="dalle-dist")
add_doctor(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(["doctor", *sys.argv[1:]])
try:
    status = args.run(args)
except DalleDistError as exc:
    print(f"error: {exc}", file=sys.stderr)
    status = 2
loaded = sorted({m.split(".")[0] for m in set(sys.modules) - baseline} & {HEAVY})
print("HEAVY", loaded, file=sys.stderr)
raise SystemExit(status)
""".replace("{HEAVY}", repr(set(HEAVY)))


def expected(log: Path) -> str:
    return log.name.split("__", 1)[0]


def doctor(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN_DOCTOR, *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=LOGS_DIR.parent)


def heavy_loaded(stderr: str) -> str:
    line = [x for x in stderr.splitlines() if x.startswith("HEAVY ")]
    assert line, stderr
    return line[-1]


# -- the logs -----------------------------------------------------------------------------

def test_logs_cover_every_category() -> None:
    counts = Counter(expected(log) for log in LOGS)
    assert len(LOGS) >= 45
    assert set(counts) <= {*CATEGORIES, BENIGN, UNKNOWN}, set(counts) - {*CATEGORIES, BENIGN,
                                                                         UNKNOWN}
    assert all(counts[c] >= 3 for c in (*CATEGORIES, BENIGN, UNKNOWN)), counts
    for log in LOGS:
        assert len(log.read_text().splitlines()) >= 2, f"{log.name}: a log is not one line"


@pytest.mark.parametrize("log", [log for log in LOGS if log.name not in CLI_LOGS],
                         ids=lambda log: log.stem)
def test_category(log: Path) -> None:
    text = log.read_text()
    diagnosis = diagnose(text)
    assert diagnosis.category == expected(log), (diagnosis.signature, diagnosis.matches)
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
        got = diagnose(log.read_text()).category
        total[expected(log)] += 1
        if got == expected(log):
            right[expected(log)] += 1
        else:
            wrong.append(f"{log.name} -> {got}")
    accuracy = sum(right.values()) / len(LOGS)
    table = "\n".join(f"  {c:30s} {right[c]:3d}/{total[c]:<3d}" for c in sorted(total))
    with capsys.disabled():
        print(f"\ndoctor accuracy {accuracy:.3f} over {len(LOGS)} logs\n{table}")
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
    probe = ("import sys\nfrom dalle_dist.diagnose.doctor import diagnose\n"
             "diagnose(open(sys.argv[1]).read())\n"
             f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    log = LOGS_DIR / "cuda-oom__single-gpu-new-format.log"
    result = subprocess.run([sys.executable, "-c", probe, str(log)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the command -------------------------------------------------------------------------------

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
    assert heavy_loaded(result.stderr) == "HEAVY []"


def test_cli_human_output_names_cause_fix_check_and_lines() -> None:
    log = LOGS_DIR / "cuda-oom__torchrun-rank0-oom-others-timeout.log"
    result = doctor(str(log))
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "category: cuda-oom"
    assert [line.split(":")[0] for line in out[1:5]] == ["cause", "fix", "check", "matched"]
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
    assert result.returncode == 1
    assert result.stdout.startswith("category: unknown\n")


@pytest.mark.parametrize("target", ["missing.log", "logs"], ids=["missing", "directory"])
def test_cli_unreadable_logfile_is_one_error_line(target: str) -> None:
    result = doctor(target)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("HEAVY ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: LOGFILE {target} "), errors
    assert "Traceback" not in result.stderr and result.stdout == ""
