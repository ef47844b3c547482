"""The benches refuse a bad flag before they build anything.

Their runs take minutes; a pattern DALLE-pytorch does not know used to end one with its
assertion's traceback after the first pairs had run, and `--modes bogus` timed the eager
decoder under that name (a result for a mode nobody asked for), and a token count that is
not a square was timed as the square below it. One subprocess imports the scripts and
calls each main() with the bad command lines in turn: each must stop with
argparse's usage error (exit 2, one `error:` line naming the flag) and no traceback, within
seconds (a check that lets a flag through starts the run, and the timeout fails the test).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (script, command line, what its error line must say)
CASES = [
    ("train_side_by_side", ["--patterns", "full,axial_rows"], "--patterns: unknown 'axial_rows'"),
    ("train_side_by_side", ["--image_tokens", "256,100"], "--image_tokens 100:"),
    ("train_side_by_side", ["--image_tokens", "256,"], "--image_tokens '256,': an empty entry"),
    ("train_side_by_side", ["--image_tokens", "256,1k"], "--image_tokens: '256,1k' is not"),
    ("train_side_by_side", ["--batch", "0"], "--batch must be at least 1"),
    ("train_side_by_side", ["--rounds", "0"], "--rounds must be at least 1"),
    ("generate_side_by_side", ["--modes", "eager,bogus"], "--modes: unknown 'bogus'"),
    ("generate_side_by_side", ["--precisions", "fp8"], "--precisions: unknown 'fp8'"),
    ("compile_speedup", ["--attn_types", "full,bogus"], "--attn_types: unknown 'bogus'"),
    ("compile_speedup", ["--sizes", "256x8,99x2"], "--sizes: 99 image tokens are not"),
    ("compile_speedup", ["--sizes", "256x0"], "--sizes: '256x0' is not positive integers"),
    ("train_side_by_side", ["--image_tokens", "99"], "--image_tokens: 99 image tokens are not"),
    ("compile_speedup", ["--sizes", "256"], "--sizes: '256'"),
    ("compile_speedup", ["--threads", "0"], "--threads must be at least 1"),
    ("train_step", ["--attn_types", "full,bogus"], "--attn_types: unknown 'bogus'"),
    ("train_step", ["--image_tokens", "99"], "--image_tokens: 99 image tokens are not"),
    ("heap_kept", ["--cases", "full:256:8,full:256"], "--cases: 'full:256' is not"),
    ("heap_kept", ["--cases", "bogus:256:8"], "--cases: unknown 'bogus'"),
    ("heap_kept", ["--cases", "full:99:2"], "--cases: 99 image tokens are not"),
    ("attention", ["--impls", "auto,fast"], "--impls: unknown 'fast'"),
]

DRIVER = """
import contextlib, importlib, io, json, sys
sys.path[:0] = [sys.argv[1] + "/bench", sys.argv[1] + "/src"]
found = []
for script, argv, _ in json.loads(sys.argv[2]):
    module = importlib.import_module(script)
    sys.argv = [script + ".py", *argv]
    err = io.StringIO()
    code = None
    with contextlib.redirect_stderr(err):
        try:
            module.main()
        except SystemExit as e:
            code = e.code
    found.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(found))
"""


def test_bench_scripts_refuse_bad_flags_before_running() -> None:
    result = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT), json.dumps(CASES)],
                            capture_output=True, text=True, timeout=90, check=True)
    found = json.loads(result.stdout.splitlines()[-1])
    for (script, argv, expected), got in zip(CASES, found, strict=True):
        errors = [line for line in got["stderr"].splitlines() if "error:" in line]
        assert got["code"] == 2, (script, argv, got)
        assert "Traceback" not in got["stderr"], (script, argv, got["stderr"])
        assert len(errors) == 1 and expected in errors[0], (script, argv, got["stderr"])
