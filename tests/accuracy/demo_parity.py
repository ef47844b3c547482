"""`make demo`'s training on 1 process, on torch DDP (2 ranks) and on DeepSpeed (2 ranks).

Same global batch (32), same steps, same built-in VAE (trained or taken from the cache
first), so the three caption fidelities should agree within sampling noise (goal: within
0.05 of the single process). Prints JSON. About 15 minutes on 2 CPU cores.
Run from the repository: python -m tests.accuracy.demo_parity [--runs single,...].
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
RUNS = {
    "single": [str(BIN / "dalle-dist")],
    "torch-2-ranks": [str(BIN / "torchrun"), "--nproc_per_node", "2", "-m", "dalle_dist"],
    "deepspeed-2-ranks": [str(BIN / "deepspeed"), "--num_gpus", "2", "--module", "dalle_dist"],
}
BACKEND_FLAGS = {"single": [], "torch-2-ranks": ["--distributed_backend", "torch"],
                 "deepspeed-2-ranks": ["--deepspeed"]}
FIDELITY = re.compile(r"caption fidelity: ([0-9.]+) over (\d+) images")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--fidelity_images", type=int, default=256,
                        help="held-out captions scored per run (default 256)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs.split(","):
            cmd = [*RUNS[name], "train", *BACKEND_FLAGS[name], "--fidelity_images",
                   str(args.fidelity_images), "--dalle_output_file_name", f"{tmp}/{name}"]
            start = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"} if name != "single"
                                 else None)
            match = FIDELITY.search(out.stdout + out.stderr)
            results[name] = ({"fidelity": float(match.group(1)), "images": int(match.group(2)),
                              "seconds": round(time.perf_counter() - start, 1)}
                             if out.returncode == 0 and match else
                             {"error": (out.stdout + out.stderr)[-1500:]})
    single = results.get("single", {}).get("fidelity")
    for result in results.values():
        if single is not None and "fidelity" in result:
            result["difference_to_single"] = round(result["fidelity"] - single, 3)
    json.dump({"bench": "demo_parity", "results": results}, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
