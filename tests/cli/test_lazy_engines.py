"""DESIGN.md: `import dalle_dist` and `dalle-dist --help` never import an optional engine."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import dalle_dist
from dalle_dist.cli import build_parser
for command in ([], ["train"], ["train-vae"], ["generate"]):
    try:
        build_parser().parse_args([*command, "--help"])
    except SystemExit:
        pass
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"deepspeed", "horovod", "webdataset",
                                                           "apex", "triton"})
print("LOADED", loaded, file=sys.stderr)
"""


def test_help_loads_no_engine() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stderr, result.stderr[-500:]
