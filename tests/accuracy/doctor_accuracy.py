"""`dalle-dist doctor`'s accuracy per category on the written logs and the real sets.

Sets: `written` (tests/diagnose/logs, the category in each name) and every real set under
tests/diagnose/real/ that has a SOURCES.json (`dev`: logs users posted to DeepSpeed,
PyTorch, Horovod, Apex and DALLE-pytorch, which the signatures were written against;
`heldout`: logs from other projects, not read while writing them, when it is there).
Prints one JSON object: per set, the accuracy, per-category accuracy, and every log doctor
got wrong (file, expected, got). `--set NAME` limits it to some sets.
Run from the repository: python -m tests.accuracy.doctor_accuracy [--set NAME].
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.diagnose.corpus import real_set, real_sets, score, written_set

TESTS = Path(__file__).resolve().parents[1] / "diagnose"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", dest="sets", metavar="NAME",
                        help="written, dev, heldout, ... (default: all there are)")
    args = parser.parse_args()
    sets = {"written": written_set(TESTS / "logs")}
    sets.update({name: real_set(path) for name, path in real_sets(TESTS / "real").items()})
    chosen = args.sets or list(sets)
    missing = [name for name in chosen if name not in sets]
    if missing:
        parser.error(f"no set {', '.join(missing)}; there are: {', '.join(sets)}")
    print(json.dumps({name: score(sets[name]).to_json() for name in chosen}, indent=2))


if __name__ == "__main__":
    main()
