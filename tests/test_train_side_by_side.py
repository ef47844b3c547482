"""bench/train_side_by_side.py against the real DALLE-pytorch 1.6.6 (installed by `make test`),
on a tiny model: what its JSON reports, and that it refuses unequal models.

The bench is how issue 25's figures are made, and nothing else runs it: a change to our
model that breaks the parameter or FLOP equality with 1.6.6, or a setting that reaches only
one side, would surface only when someone next spends minutes on a full run. One subprocess
runs the script's main() four times (about 15 s):

  every pattern with `--rotary_shift both` and `--profile`: one result per pattern and
    setting, each with equal parameter counts (1.6.6's less its LayerScale vectors) and
    weight-matmul FLOPs within the tolerance, and the rotary + shift setting reaching both
    sides (its parameter count differs from the plain one's: rotary replaces the
    positional embeddings);
  `--compile` on one pattern: our side compiled, as `train --compile` compiles;
  a FLOP mismatch and a parameter mismatch, made by taking the bench's correction for
    1.6.6's full-vocabulary logits or its LayerScale vectors away: each must stop the run
    with one `error:` line naming what differs, exit status 2, no traceback and no JSON.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = ["--dim", "32", "--depth", "1", "--heads", "2", "--dim_head", "16",
        "--image_tokens", "64", "--batch", "2", "--text_seq_len", "8",
        "--num_text_tokens", "50", "--num_image_tokens", "16", "--rounds", "1",
        "--warmup", "0"]

#: (name, extra flags, what to take away before the run)
RUNS = [
    ("both", ["--rotary_shift", "both", "--profile", "2"], None),
    ("compiled", ["--patterns", "full", "--compile"], None),
    ("flops", ["--patterns", "full"], "full_vocab_excess"),
    ("parameters", ["--patterns", "axial_row"], "layerscale_parameters"),
]

DRIVER = """
import contextlib, io, json, sys
sys.path[:0] = [sys.argv[1] + "/bench", sys.argv[1] + "/src"]
import train_side_by_side as bench
found = {}
kept = {name: getattr(bench, name) for name in ("full_vocab_excess", "layerscale_parameters")}
for name, argv, removed in json.loads(sys.argv[2]):
    for kept_name, function in kept.items():
        setattr(bench, kept_name, (lambda *args: 0) if kept_name == removed else function)
    sys.argv = ["train_side_by_side.py", *argv]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            bench.main()
        except SystemExit as e:
            code = e.code
    found[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(found))
"""


def run_bench() -> dict[str, dict]:
    runs = [(name, TINY + extra, removed) for name, extra, removed in RUNS]
    result = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT), json.dumps(runs)],
                            capture_output=True, text=True, timeout=300, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def test_train_side_by_side_reports_equal_models_and_refuses_unequal_ones() -> None:
    found = run_bench()

    both = found["both"]
    assert both["code"] == 0, both["stderr"][-2000:]
    report = json.loads(both["stdout"])
    assert report["versions"]["dalle-pytorch"] == "1.6.6"
    assert report["settings"]["rotary_shift"] == "both"
    assert "axial_col runs in its place" in report["skipped"]["sparse"]
    results = report["results"]
    assert sorted((r["pattern"], r["rotary_shift"]) for r in results) == sorted(
        (p, s) for p in ("full", "axial_row", "conv_like", "axial_col") for s in (False, True))
    counts = {}
    for r in results:
        params = r["parameters"]
        assert params["dalle_pytorch_matched"] == params["ours"], r
        assert params["dalle_pytorch_layerscale"] == 2 * 1 * 32  # 2 branches x depth x dim
        assert abs(r["forward_flops"]["weight_matmuls_matched_off"]) <= 0.01, r
        counts.setdefault(r["rotary_shift"], set()).add(params["ours"])
        peak = r["matmul_peak_gflops"] * 1e9
        for side in ("dalle_pytorch", "ours"):
            step = r[side]["median_step_s"]
            assert step > 0 and math.isclose(
                r[side]["mfu"], r["model_flops_per_step"] / step / peak, rel_tol=0.1), r
        assert math.isclose(r["ratio_wall"], r["dalle_pytorch"]["median_step_s"]
                            / r["ours"]["median_step_s"], rel_tol=0.1), r
        assert r["profile"]["ceiling"]["ratio"] > 0 and r["profile"]["top_ours"], r
    # one count per setting (the patterns differ only in the attention's mask), and the
    # two settings' counts differ: rotary + shift reached both models
    assert len(counts[False]) == len(counts[True]) == 1 and counts[False] != counts[True]

    compiled = found["compiled"]
    assert compiled["code"] == 0, compiled["stderr"][-2000:]
    report = json.loads(compiled["stdout"])
    assert report["settings"]["compile"] is True
    assert [(r["pattern"], r["rotary_shift"]) for r in report["results"]] == [("full", False)]

    for name, says in (("flops", "error: full at 64 image tokens: forward weight-matmul "
                                 "FLOPs differ by"),
                       ("parameters", "error: axial_row at 64 image tokens: parameters "
                                      "differ")):
        refused = found[name]
        assert refused["code"] == 2, (name, refused)
        assert refused["stdout"] == "", (name, refused["stdout"][:500])
        assert "Traceback" not in refused["stderr"], refused["stderr"]
        lines = refused["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(says), (name, refused["stderr"])
