"""`dalle-dist doctor [LOGFILE | -] [--json]`: a failure log in, cause, fix and check out.

Exit status: 0 when a cause was recognised (or the log holds only harmless warnings),
1 when nothing in the log is known (category `unknown`), 2 when LOGFILE cannot be read.
Reads the log only: the diagnosis (dalle_dist.doctor) imports neither torch nor
any engine, so it works where they are broken (the `dalle-dist` process itself imports
torch to build its parsers).

`--json` prints one object with exactly these keys:
    category  a category of dalle_dist.doctor.signatures.CATEGORIES, or "benign" (only
              harmless warnings), or "unknown" (nothing matched)
    cause, fix, check   strings (check is one shell command)
    matches   the log lines the diagnosis rests on, in log order (at most 10)
    confidence  a number 0..1: how clearly the log shows this cause (0 for unknown)
    alternatives  up to two other readings: [{"category", "line"}], the line each rests on
Notes on harmless warnings seen beside a failure appear in the human output only.
When nothing is recognised the human output says what to run and what to paste instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dalle_dist.config_base import JsonOutput, add_flags
from dalle_dist.errors import ConfigError

_SHOWN_WIDTH = 200  # matched lines can be long (a whole argv); the human view cuts them
# What to do when doctor recognises nothing: what the issue asks for, in the human output.
UNKNOWN_NEXT_STEPS = (
    "run `dalle-dist check` on the failing machine: it shows what the machine can run",
    "paste, with the output of `dalle-dist check`: the full command line; the first "
    "failing rank's traceback from `Traceback (most recent call last):` to its last line; "
    "torchrun's `Root Cause (first observed failure)` section if there is one",
)


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_WIDTH else text[:_SHOWN_WIDTH - 3] + "..."


def add_doctor(p: argparse.ArgumentParser) -> None:
    p.description = ("Match a training log against known failures of "
                     "DeepSpeed, Horovod, NCCL, CUDA, Apex, Triton and "
                     "dalle-dist itself, and print the most likely root cause, "
                     "its fix and a command to check it. Exit 0 when a cause "
                     "(or only harmless warnings) was found, 1 when the log "
                     "matches nothing known.")
    p.add_argument("logfile", metavar="LOGFILE", nargs="?", default="-",
                   help="the log to read; - or nothing reads standard input")
    add_flags(p, JsonOutput, help={
        "json": "print one JSON object: category, cause, fix, check, matches, confidence "
                "(0..1), alternatives (up to two {category, line})"})
    p.set_defaults(run=run_doctor)


def read_log(name: str) -> str:
    """The log's text (undecodable bytes replaced); a path that cannot be read is a ConfigError."""
    if name == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    path = Path(name)
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"LOGFILE {path} does not exist",
                          "check the path, or pipe the log in: ... 2>&1 | dalle-dist doctor -"
                          ) from None
    except IsADirectoryError:
        raise ConfigError(f"LOGFILE {path} is a directory", "give the log file") from None
    except OSError as exc:
        raise ConfigError(f"LOGFILE {path} cannot be read ({exc.strerror})",
                          "check its permissions") from None


def run_doctor(args: argparse.Namespace) -> int:
    from dalle_dist.doctor.diagnosis import diagnose
    from dalle_dist.doctor.signatures import BENIGN, UNKNOWN

    diagnosis = diagnose(read_log(args.logfile))
    if args.json:
        print(json.dumps(diagnosis.to_json(), indent=2))
    else:
        print(f"category: {diagnosis.category}")
        print(f"cause:    {diagnosis.cause}")
        print(f"fix:      {diagnosis.fix}")
        print(f"check:    {diagnosis.check}")
        if diagnosis.category != UNKNOWN:
            print(f"confidence: {diagnosis.confidence:.2f}")
        if diagnosis.matches:
            print("matched:")
            for match in diagnosis.matches:
                print(f"  {match.line}: {_cut(match.text)}")
        if diagnosis.alternatives:
            print("also possible:")
            for alternative in diagnosis.alternatives:
                print(f"  {alternative.category}: {_cut(alternative.line)}")
        if diagnosis.category == UNKNOWN:
            print("next steps:")
            for step in UNKNOWN_NEXT_STEPS:
                print(f"  - {step}")
        if diagnosis.benign and diagnosis.category != BENIGN:
            print("harmless warnings also seen:")
            for note in diagnosis.benign:
                print(f"  - {note}")
    return 1 if diagnosis.category == UNKNOWN else 0
