"""What keeping the heap (train/cpu_settings.py) does to a CPU `train` run, printed as JSON.

Runs `dalle-dist train` on the bench model (dim 256, depth 4, 4 x 64 heads, text 32, fp32,
2 threads, the built-in shapes) in turns, each case with and without the setting, and
compares each run's samples/s (the median of its logged windows after the first, which
holds the first step's set-up), its minor page faults (the difference between the two,
over the steps, is what the steps fault) and its peak resident memory (the child's own,
from os.wait4). "Without" sets MALLOC_ARENA_MAX to glibc's own default (8 arenas per CPU
on 64-bit), a variable the run takes as the user's choice, so it leaves malloc alone; the
thresholds then behave exactly as under glibc's defaults.

Each case trains a throwaway 2-layer VAE of its image size first (a few seconds), so
1024 image tokens need no cached VAE: --cases full:256:8,axial_row:1024:2 (pattern,
image tokens, batch).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import comma_list, emit, positive_ints, require_positive, square_tokens

from dalle_dist.model.patterns import PATTERNS
from dalle_dist.train.cpu_settings import HEAP_KEPT

MODEL = ["--dim", "256", "--depth", "4", "--heads", "4", "--dim_head", "64",
         "--text_seq_len", "32", "--truncate_captions"]
VAE_LAYERS = 2


def train_vae(folder: Path, image_size: int) -> Path:
    path = folder / f"vae{image_size}.pt"
    if path.exists():  # an earlier case's, of the same size
        return path
    result = subprocess.run(
        [sys.executable, "-m", "dalle_dist", "train-vae", "--image_size", str(image_size),
         "--num_layers", str(VAE_LAYERS), "--num_tokens", "512", "--emb_dim", "64",
         "--hidden_dim", "16", "--epochs", "1", "--batch_size", "8", "--shapes_count", "16",
         "--vae_output_file_name", str(path)],
        cwd=folder, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-2000:])
    return path


def run_once(vae: Path, pattern: str, batch: int, steps: int, kept: bool, threads: int,
             folder: Path) -> dict[str, float]:
    """One `train` run: its samples/s, minor faults (start-up's included) and peak RSS (MB)."""
    cmd = [sys.executable, "-m", "dalle_dist", "train", *MODEL, "--vae_path", str(vae),
           "--attn_types", pattern, "--batch_size", str(batch), "--shapes_count",
           str(steps * batch), "--epochs", "1", "--fidelity_images", "0",
           "--log_every_n_steps", "10", "--save_every_n_steps", "0",
           "--sample_every_n_steps", "0", "--dalle_output_file_name", "run", "--overwrite"]
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("MALLOC_")}
    env["OMP_NUM_THREADS"] = str(threads)
    if not kept:
        env["MALLOC_ARENA_MAX"] = str(8 * (os.cpu_count() or 1))
    log = folder / "run.log"
    with open(log, "w") as out:
        child = subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=out)
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(log.read_text()[-3000:])
    if (HEAP_KEPT in log.read_text()) != kept:
        raise SystemExit(f"the run {'did not keep' if kept else 'kept'} its heap: {log}")
    records = [json.loads(line) for line in (folder / "run.metrics.jsonl").read_text()
               .splitlines()]
    windows = [r["samples_per_s"] for r in records if "samples_per_s" in r][1:]
    return {"samples_per_s": statistics.median(windows),
            "minor_faults": usage.ru_minflt,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def checked_case(parser: argparse.ArgumentParser, case: str) -> tuple[str, int, int]:
    """One --cases entry, PATTERN:IMAGE_TOKENS:BATCH, or the usage error."""
    fields = case.split(":")
    if len(fields) != 3:
        parser.error(f"--cases: {case!r} is not PATTERN:IMAGE_TOKENS:BATCH (e.g. full:256:8)")
    pattern = comma_list(parser, "--cases", fields[0], PATTERNS)[0]
    tokens, batch = positive_ints(parser, "--cases", ":".join(fields[1:]), sep=":")
    return pattern, square_tokens(parser, "--cases", tokens), batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="full:256:8,axial_row:1024:2,full:1024:2",
                        help="pattern:image_tokens:batch, comma list")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.steps < 20:
        parser.error("--steps must be at least 20: runs log every 10 steps and the first "
                     "window, which holds the first step's set-up, is left out")
    require_positive(parser, args, "rounds", "threads")
    cases = [checked_case(parser, case) for case in comma_list(parser, "--cases", args.cases)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for pattern, tokens, batch in cases:
            side = math.isqrt(tokens)
            vae = train_vae(folder, side * 2**VAE_LAYERS)
            runs: dict[str, list[dict[str, float]]] = {"default": [], "kept": []}
            for round_ in range(args.rounds):
                order = ["default", "kept"] if round_ % 2 == 0 else ["kept", "default"]
                for name in order:
                    runs[name].append(run_once(vae, pattern, batch, args.steps,
                                               name == "kept", args.threads, folder))
            summary = {name: {key: round(statistics.median(r[key] for r in rs), 2)
                              for key in rs[0]} for name, rs in runs.items()}
            results.append({
                "pattern": pattern, "image_tokens": tokens, "batch": batch,
                **summary,
                "speedup": round(summary["kept"]["samples_per_s"]
                                 / summary["default"]["samples_per_s"], 3),
                # start-up faults alike in both: the difference is the steps'
                "faults_saved_per_step": round((summary["default"]["minor_faults"]
                                                - summary["kept"]["minor_faults"])
                                               / args.steps),
                "runs_samples_per_s": {name: [round(r["samples_per_s"], 2) for r in rs]
                                       for name, rs in runs.items()}})
    emit({"bench": "heap_kept", "config": vars(args), "results": results})


if __name__ == "__main__":
    main()
