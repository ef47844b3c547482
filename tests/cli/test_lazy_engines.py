"""docs/design.md: `import dalle_dist` and `dalle-dist --help` never import an optional engine."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import dalle_dist
import argparse
from dalle_dist.cli import build_parser
parser = build_parser()
sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
commands = [[]] + [[name] for name in sub.choices]
for name, sub_parser in sub.choices.items():
    nested = [a for a in sub_parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands += [[name, child] for action in nested for child in action.choices]
print("COMMANDS", [" ".join(c) for c in commands], file=sys.stderr)
codes = {}
for command in commands:
    try:
        build_parser().parse_args([*command, "--help"])
    except SystemExit as exc:
        codes[" ".join(command)] = exc.code
    else:
        codes[" ".join(command)] = "no exit"
print("CODES", {c: code for c, code in codes.items() if code not in (0, None)}, file=sys.stderr)
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"deepspeed", "horovod", "webdataset",
                                                           "apex", "triton", "wandb",
                                                           "tensorboard"})
print("LOADED", loaded, file=sys.stderr)
"""


def test_help_loads_no_engine() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    # Every `--help` ended in status 0: fails if one was refused (exit 2, e.g. a parser that
    # lost its --help) and so never printed the help this test means to load.
    assert "CODES {}" in result.stderr, result.stderr[-2000:]
    assert "LOADED []" in result.stderr, result.stderr[-500:]
    for command in ("'train'", "'generate'", "'check'", "'checkpoint inspect'"):
        assert command in result.stderr, f"{command} was not asked for --help"
