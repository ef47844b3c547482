"""The CLI answers at once, and its flag reference is the code's.

docs/design.md ("Layers"): a command imports torch and engines only when it needs them.
Each case runs `dalle-dist ...` in a fresh interpreter, as a user does, and pins which heavy
modules were loaded when it ended. Bugs these catch:
- a command module imported at start-up again (cli/__init__.py importing train_cmds makes
  `dalle-dist --help` import torch: about 2 s on a small machine, 5 s of CPU on a busy one);
- a package __init__ that imports its heavy modules eagerly (backends/__init__.py
  importing the registry makes `check --help` import torch through backends.catalog);
- doctor's signatures importing a module that imports torch;
- docs/flags.md edited by hand, or a flag added without regenerating it;
- a flag with no help, or a help that only repeats its default.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dalle_dist.cli import build_parser
from dalle_dist.cli.flags_cmd import documented, markdown

ROOT = Path(__file__).resolve().parents[2]
#: a user's failure log (NVlabs/imaginaire issue 6): Apex missing, which doctor knows
LOG = ROOT / "tests/diagnose/real/blind/apex-missing-or-wrong__NVlabs-imaginaire-6.log"
#: what a command must not load unless it needs it (top-level package names)
HEAVY = ("torch", "numpy", "PIL", "deepspeed", "horovod", "wandb", "tensorboard", "webdataset")

PROBE = """
import json, sys
from dalle_dist.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
print("PROBE", json.dumps({"status": status, "heavy": heavy,
                           "fsdp": "torch.distributed.fsdp" in sys.modules}), file=sys.stderr)
""".replace("HEAVY", repr(HEAVY))


def _loaded(*argv: str, stdin: Path | None = None) -> dict:
    with open(stdin or "/dev/null", "rb") as source:
        done = subprocess.run([sys.executable, "-c", PROBE, *argv], stdin=source,
                              capture_output=True, text=True, timeout=120, check=False)
    line = next((x for x in done.stderr.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, done.stderr[-2000:]
    return json.loads(line.removeprefix("PROBE "))


@pytest.mark.parametrize("argv", [("--help",), ("check", "--help"), ("doctor", "--help"),
                                  ("doctor", "--json", "-")], ids=" ".join)
def test_answers_without_torch(argv: tuple[str, ...]) -> None:
    found = _loaded(*argv, stdin=LOG)
    # status 0: the help was printed, or (doctor -) the log's known cause was found
    assert found["status"] == 0 and found["heavy"] == [], found


@pytest.mark.parametrize("argv", [("train", "--help"), ("plan", "--dim", "64", "--depth", "2")],
                         ids=" ".join)
def test_torch_but_no_engine(argv: tuple[str, ...]) -> None:
    """train's flags come from configs next to torch code, and plan builds the model on
    the meta device; neither loads an engine. `train --help` does not load FSDP either
    (backends/fsdp.py imports it when a run distributes); plan does, through torch itself:
    initialising a meta-device parameter imports torch._dynamo, which imports FSDP."""
    found = _loaded(*argv)
    assert found["status"] == 0
    assert set(found["heavy"]) <= {"torch", "numpy", "PIL"} and "torch" in found["heavy"], found
    if argv[0] == "train":
        assert not found["fsdp"], found


def test_docs_flags_md_is_what_the_command_prints() -> None:
    checked_in = (ROOT / "docs" / "flags.md").read_text()
    assert checked_in == markdown(), (
        "docs/flags.md differs from the code: run `dalle-dist flags --markdown > "
        "docs/flags.md`")


#: a help that says nothing but its default: "(default 128)", "default: none", "required"
_ONLY_DEFAULT = re.compile(r"^\(?\s*(default\b[^)]*|required)\)?$")


def test_every_flag_has_a_help_that_says_more_than_its_default() -> None:
    bare = []
    count = 0
    for prog, _, rows in documented(build_parser(), "dalle-dist"):
        for flag, text in rows:
            count += 1
            if not text.strip() or _ONLY_DEFAULT.match(text.strip()):
                bare.append(f"{prog} {flag}: {text!r}")
    assert count > 150  # every command's flags were seen
    assert not bare, "flags without a help:\n" + "\n".join(bare)


def test_only_the_chosen_command_gets_its_flags() -> None:
    """main() builds one command's flags; build_parser() with no argument builds all."""
    lean = build_parser(["doctor"])
    full = build_parser()
    sub = next(a for a in lean._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices["train"]._actions) == 1  # --help only
    assert len(sub.choices["doctor"]._actions) > 1
    sub_full = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub_full.choices["train"]._actions) > 50
