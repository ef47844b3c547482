"""`dalle-dist doctor` on dalle-dist's own one-line errors, as the CLI really prints them.

tests/conftest.py's assert_user_error hands every real `error: ...` line an error-path test
captured to check_doctor_reads(): doctor must read it without failing, never as harmless,
and never as `unknown` when the line has docs/design.md's `error: what (fix)` shape; for
the tests listed in EXPECTED_SIGNATURE it must give the signature named there. A reworded message
that no pattern in dalle_dist.doctor.signatures matches any more fails the test that
printed it, instead of silently turning doctor's answer into the generic `dalle-dist-error`.
"""

from __future__ import annotations

import os
import re

from dalle_dist.doctor.diagnosis import Diagnosis, diagnose
from dalle_dist.doctor.signatures import BENIGN, UNKNOWN

# docs/design.md's shape: `error: <what is wrong> (<what to do>)`.
_WITH_FIX = re.compile(r"^error: .+ \(.+\)$")

#: The signature doctor must give the error a test prints, by test (`path::function`, or
#: `path::function[param id]` for one parametrization). Only tests whose error has a
#: signature of its own are listed; others need only be read as a dalle-dist error.
#: test_doctor.py checks that every entry names a test that exists.
_BACKENDS = "tests/backends/test_errors.py::"
EXPECTED_SIGNATURE: dict[str, str] = {
    _BACKENDS + "test_unknown_backend_lists_the_known_ones": "bad-arguments",
    _BACKENDS + "test_deepspeed_flag_contradicting_another_backend": "bad-arguments",
    _BACKENDS + "test_engine_that_does_not_import[deepspeed-deepspeed-deepspeed]":
        "deepspeed-not-installed",
    _BACKENDS + "test_engine_that_does_not_import[horovod-horovod/torch-horovod]":
        "horovod-torch-extension",
    _BACKENDS + "test_backend_without_a_launcher": "no-launcher-environment",
    _BACKENDS + "test_batch_that_cannot_be_split": "batch-not-divisible",
    _BACKENDS + "test_deepspeed_fp16_on_cpu": "fp16-without-gpu",
    _BACKENDS + "test_bad_deepspeed_config[batch-mismatch]": "batch-not-divisible",
    _BACKENDS + "test_bad_deepspeed_config[micro-batch]": "batch-not-divisible",
    _BACKENDS + "test_bad_deepspeed_config[amp-block]": "deepspeed-amp-removed",
    _BACKENDS + "test_ga_steps_that_do_not_divide": "batch-not-divisible",
    _BACKENDS + "test_ga_steps_that_do_not_divide_in_one_process": "batch-not-divisible",
    "tests/cli/test_check.py::test_train_stops_at_once_with_the_same_verdict":
        "deepspeed-not-installed",
    "tests/cli/test_check.py::test_fp16_with_deepspeed_on_cpu_is_refused_by_check_and_by_train":
        "fp16-without-gpu",
    "tests/cli/test_errors.py::test_argparse_mistakes_follow_the_contract": "bad-arguments",
}


def expected_signature(nodeid: str) -> str | None:
    """The entry of EXPECTED_SIGNATURE for this test: its own parametrization's, else the
    function's."""
    if nodeid in EXPECTED_SIGNATURE:
        return EXPECTED_SIGNATURE[nodeid]
    return EXPECTED_SIGNATURE.get(nodeid.split("[", 1)[0])


def current_test() -> str:
    """The running test's node id (pytest sets PYTEST_CURRENT_TEST: `<nodeid> (<phase>)`)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def judge(line: str, diagnosis: Diagnosis, expected: str | None) -> Diagnosis:
    """Assert that `diagnosis` is a sensible reading of this real one-line error (see the
    module docstring); expected: the signature it must have, if any."""
    reading = (diagnosis.category, diagnosis.signature, line)
    assert diagnosis.category != BENIGN, reading
    if _WITH_FIX.match(line):
        assert diagnosis.category != UNKNOWN, reading
    if expected is not None:
        assert diagnosis.signature == expected, (expected, reading)
    return diagnosis


def check_doctor_reads(line: str) -> Diagnosis:
    """doctor's real reading of this line, judged for the running test."""
    nodeid = current_test()
    return judge(line, diagnose(line), expected_signature(nodeid))
