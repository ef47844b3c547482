"""`plan`'s VQGAN encode bytes against the measured peak of a real encode on CPU.

For each config, a fresh process builds our VQGAN (random weights: memory does not depend
on them) and an image batch, encodes once (oneDNN's kernel caches and the libraries' code
land in the baseline), then measures a second encode as plan_check.py measures a
training step: glibc maps every allocation over 64 KiB on its own (MALLOC_MMAP_THRESHOLD_),
so freed tensors leave the resident set at once, and the peak resident set (VmHWM, reset
through /proc/self/clear_refs) minus the resident set before the encode is its peak of
live memory. The estimate is plan/vqgan.py's vqgan_encode_bytes per image x batch, less the
image batch itself (already resident before the encode, as the loader's batch is).
Prints JSON: per config, measured and estimated bytes and estimate / measured.
Run from the repository: python -m tests.accuracy.plan_vqgan_check.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: name -> (ddconfig + embed_dim / n_embed, batch)
CASES: dict[str, tuple[dict, int]] = {
    "f8-128px-ch64-b4": ({"embed_dim": 64, "n_embed": 1024, "ch": 64, "ch_mult": [1, 2, 2, 4],
                          "num_res_blocks": 2, "attn_resolutions": [16], "resolution": 128,
                          "z_channels": 64}, 4),
    "f4-64px-ch32-attn-b8": ({"embed_dim": 16, "n_embed": 512, "ch": 32, "ch_mult": [1, 2, 4],
                              "num_res_blocks": 1, "attn_resolutions": [16, 32],
                              "resolution": 64, "z_channels": 16}, 8),
}


def _status_kb(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


def measure(fields: dict, batch: int) -> int:
    """Peak bytes of one encode of `batch` images above the resident set before it."""
    import torch

    from dalle_dist.model.vqgan import VQGAN, VQGANConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = VQGANConfig(**fields)
    model = VQGAN(config).eval().requires_grad_(False)
    images = torch.rand(batch, config.in_channels, config.resolution, config.resolution)
    model.get_codebook_indices(images)  # warm-up: kernel caches into the baseline
    base = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    model.get_codebook_indices(images)
    return (_status_kb("VmHWM") - base) * 1024


def estimated(fields: dict, batch: int) -> int:
    from dalle_dist.model.vqgan import VQGANConfig
    from dalle_dist.plan.vqgan import vqgan_encode_bytes

    config = VQGANConfig(**fields)
    image = config.in_channels * config.resolution**2 * 4
    return (vqgan_encode_bytes(config, "cpu") - image) * batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        fields, batch = CASES[args.case]
        print(json.dumps(measure(fields, batch)))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")]))}
    results = []
    for name, (fields, batch) in CASES.items():
        out = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True,
                             text=True, env=env, check=True, timeout=600)
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        est = estimated(fields, batch)
        results.append({"case": name, "batch": batch, "measured": measured, "estimated": est,
                        "ratio": round(est / measured, 3)})
    json.dump({"bench": "plan_vqgan_check", "device": "cpu", "results": results},
              sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
