"""How long `dalle-dist doctor` takes on a long log (the issue asks: 200k lines in seconds).

Builds a log the way long multi-rank runs write them (tests/diagnose/long_log.py:
DeepSpeed step and timer lines under its logger prefix, tqdm bars, `[rankN]:` prefixed NCCL
INFO lines, warm-up OVERFLOW lines, then one rank's CUDA OOM traceback and the other ranks'
watchdog timeouts at the end). Every line differs, as in real runs, in its numbers (steps,
times, ranks); doctor's substring prefilter reads distinct lines with digits folded, so
such a log costs little more than splitting it. `--distinct` also appends a different hex
word to every line (a log whose lines differ in letters too, e.g. run ids or file hashes):
the worst case, where the whole text is scanned for each literal the log's distinct words
do not rule out first.
Times diagnose() on it (best of --repeats) and prints JSON: lines, megabytes, seconds,
lines per second, and the category found (cuda-oom expected: the bench also checks
doctor still reads the failure at the end of a long log). To compare two versions in one
session, run it twice with PYTHONPATH pointing at each one's src/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests/

from dalle_dist.doctor.diagnosis import diagnose
from tests.diagnose.long_log import long_log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--distinct", action="store_true",
                        help="every line also differs in letters (the worst case)")
    args = parser.parse_args()
    text = long_log(args.lines, args.distinct)
    best = float("inf")
    category = None
    for _ in range(args.repeats):
        start = time.perf_counter()
        category = diagnose(text).category
        best = min(best, time.perf_counter() - start)
    print(json.dumps({"lines": args.lines, "distinct": args.distinct,
                      "megabytes": round(len(text) / 2**20, 1),
                      "seconds": round(best, 3), "lines_per_second": round(args.lines / best),
                      "category": category}, indent=2))


if __name__ == "__main__":
    main()
