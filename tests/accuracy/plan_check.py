"""`dalle-dist plan`'s estimate against the measured peak memory of real training steps.

For each config, a fresh process builds the VAE and DALL-E, trains them as dalle_dist does
(SingleBackend's engine, make_adam, the precision's autocast, clip 0.5, VAE encoding of the
image batch) for two steps, then measures the peak of a third:

  cpu   glibc maps every allocation over 64 KiB on its own (MALLOC_MMAP_THRESHOLD_), so a
        freed tensor leaves the resident set at once (as in bench/attention.py); the peak
        resident set (VmHWM, reset through /proc/self/clear_refs) minus the resident set
        before the model was built is the step's peak of live memory. The same config
        trains one step first and is freed, so that what a first step leaves behind (the
        libraries' code paged in, kernel caches: 50 to 70 MiB here, more for bf16) is in
        the baseline; `runtime` reports it.
  cuda  the same warm-up, then torch.cuda.max_memory_allocated over the third step (reset
        before it) minus what was allocated before the model; `runtime` is what the
        warm-up left allocated (cuBLAS and cuDNN workspaces). The CUDA context is in
        neither, so it is left out of the estimate too.

The estimate is the `single` row of plan.estimate for the same config, device and precision.
Prints JSON: per config, measured and estimated bytes and estimate / measured.
Run from the repository: python -m tests.accuracy.plan_check [--quick | --device cuda];
tests/test_plan.py runs --quick. Each case runs in a fresh process of this file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """One measured config: DALL-E and VAE sizes, batch, precision."""

    name: str
    batch: int
    precision: str = "fp32"
    dim: int = 128
    depth: int = 4
    heads: int = 4
    dim_head: int = 32
    text_seq_len: int = 48
    num_text_tokens: int = 257
    attn_types: tuple[str, ...] = ("full",)
    image_size: int = 32
    num_tokens: int = 128
    num_layers: int = 2
    hidden_dim: int = 64
    extra: dict[str, int] = field(default_factory=dict)
    checkpointing: bool = False  # --activation_checkpointing

    def configs(self) -> tuple[object, object]:
        from dalle_dist.model.config import DALLEConfig, VAEConfig

        vae = VAEConfig(image_size=self.image_size, num_tokens=self.num_tokens,
                        num_layers=self.num_layers, hidden_dim=self.hidden_dim)
        dalle = DALLEConfig(num_text_tokens=self.num_text_tokens,
                            text_seq_len=self.text_seq_len, num_image_tokens=self.num_tokens,
                            image_fmap_size=vae.fmap_size, dim=self.dim, depth=self.depth,
                            heads=self.heads, dim_head=self.dim_head,
                            attn_types=self.attn_types, **self.extra)
        return dalle, vae


#: Quick: the test's four (a few seconds each on one core). Full: the bench's set.
QUICK = (
    Case("full-fp32-b32", batch=32),
    Case("full-bf16-d256-256tok-b8", batch=8, precision="bf16", dim=256, depth=2,
         dim_head=64, text_seq_len=32, image_size=64),
    Case("axial-gather-fp32-256tok-b8", batch=8, attn_types=("axial_row", "axial_col"),
         text_seq_len=32, image_size=64),
    Case("full-fp32-b32-checkpointed", batch=32, checkpointing=True),
)
FULL = (
    *QUICK,
    Case("sparse-conv-masked-bf16-256tok-b8", batch=8, precision="bf16", depth=2,
         attn_types=("sparse", "conv_like"), text_seq_len=32, image_size=64),
    Case("logits-heavy-fp32-b16", batch=16, num_text_tokens=8000, num_tokens=1024,
         text_seq_len=64),
    Case("conv-gather-fp32-576tok-b2", batch=2, depth=2, attn_types=("conv_like",),
         text_seq_len=32, image_size=96),
    Case("deep-bf16-b16", batch=16, precision="bf16", depth=8, dim=192, heads=6),
    Case("vae-heavy-fp32-b16", batch=16, depth=2, image_size=128, num_layers=3,
         hidden_dim=128, num_tokens=512),
    Case("vae-phase-peak-fp32-b8", batch=8, dim=64, depth=1, heads=2, image_size=256,
         num_layers=4, hidden_dim=128),
)


#: Sizes a GPU trains in seconds and a CPU would not: 1024 image tokens, wider models.
LARGE = (
    Case("gpu-full-bf16-d512-1024tok-b8", batch=8, precision="bf16", dim=512, depth=8,
         heads=8, dim_head=64, text_seq_len=64, image_size=128, num_tokens=1024),
    Case("gpu-full-fp32-d512-1024tok-b4", batch=4, dim=512, depth=8, heads=8, dim_head=64,
         text_seq_len=64, image_size=128, num_tokens=1024),
    Case("gpu-axial-flex-bf16-1024tok-b8", batch=8, precision="bf16", dim=256, depth=4,
         attn_types=("axial_row", "axial_col"), dim_head=64, text_seq_len=64,
         image_size=128, num_tokens=1024),
    Case("gpu-logits-bf16-b32", batch=32, precision="bf16", dim=512, depth=4, heads=8,
         dim_head=64, text_seq_len=128, num_text_tokens=16000, image_size=64,
         num_tokens=8192),
)


def _status_kb(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


def _train_steps(case: Case, device: str, steps: int, before_last: object = None) -> None:
    """`steps` training steps of `case` as dalle_dist trains; calls before_last() first."""
    import torch

    from dalle_dist.backends import SingleBackend
    from dalle_dist.model import DALLE, DiscreteVAE
    from dalle_dist.train.optim import make_adam

    dalle_cfg, vae_cfg = case.configs()
    dev = torch.device(device)
    vae = DiscreteVAE(vae_cfg).to(dev).eval().requires_grad_(False)
    backend = SingleBackend.on(dev, case.precision)
    model = DALLE(dalle_cfg)
    model.transformer.set_checkpointing(case.checkpointing)
    engine = backend.distribute(model, lambda p: make_adam(p, 1e-3), lambda o: None)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(case.batch, 3, case.image_size, case.image_size, generator=generator)
    text = torch.randint(1, case.num_text_tokens, (case.batch, case.text_seq_len),
                         generator=generator)
    for step in range(steps):
        if step == steps - 1 and before_last is not None:
            before_last()
        with torch.no_grad():
            tokens = vae.get_codebook_indices(images.to(dev))
        outputs = engine.forward(text.to(dev), tokens)
        engine.backward(outputs["loss"])
        engine.clip_and_step(0.5)
        engine.zero_grad()
        del outputs, tokens


def measure(case: Case, device: str) -> tuple[int, int]:
    """(peak bytes of a training step of `case` above the process before the model existed,
    bytes left behind by a first run of it: the CPU libraries' caches; on cuda, the
    allocator's reserved memory at the end instead)."""
    import gc

    import torch

    import dalle_dist.backends
    import dalle_dist.model
    import dalle_dist.train.optim  # noqa: F401  (imports are not the step's memory)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if device == "cpu":
        before = _status_kb("VmRSS")
        _train_steps(case, device, 1)  # the same shapes: library caches land in the baseline
        gc.collect()
        base = _status_kb("VmRSS")
        _train_steps(case, device, 3,
                     lambda: Path("/proc/self/clear_refs").write_text("5"))
        return (_status_kb("VmHWM") - base) * 1024, (base - before) * 1024
    torch.cuda.init()
    before = torch.cuda.memory_allocated()
    _train_steps(case, device, 1)  # cuBLAS / cuDNN workspaces, compiled kernels
    gc.collect()
    base = torch.cuda.memory_allocated()
    _train_steps(case, device, 3, torch.cuda.reset_peak_memory_stats)
    return torch.cuda.max_memory_allocated() - base, base - before


def estimated(case: Case, device: str) -> dict[str, int]:
    from dalle_dist.plan import CUDA_CONTEXT_BYTES, estimate

    dalle_cfg, vae_cfg = case.configs()
    rows = estimate(dalle_cfg, case.batch, 1, vae=vae_cfg, precisions=(case.precision,),
                    device=device, activation_checkpointing=case.checkpointing)
    row = next(r for r in rows if r.backend == "single")
    peak = row.peak - (CUDA_CONTEXT_BYTES if device == "cuda" else 0)
    return {"estimated": peak, **{f"est_{k}": v for k, v in row.items.items()}}


def run_case(case: Case, device: str, timeout: float = 600) -> dict[str, object]:
    """Measure `case` in a fresh process and compare it with the estimate."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, __file__, "--case", json.dumps(asdict(case)),
                          "--device", device],
                         capture_output=True, text=True, env=env, check=False, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"case {case.name} failed:\n{out.stderr}")
    measured, runtime = json.loads(out.stdout.strip().splitlines()[-1])
    est = estimated(case, device)
    return {"case": case.name, "device": device, "precision": case.precision,
            "batch": case.batch, "attn_types": list(case.attn_types),
            "checkpointing": case.checkpointing,
            "measured": measured, **est, "ratio": round(est["estimated"] / measured, 3),
            "runtime": runtime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="only the test's four configs")
    parser.add_argument("--only", default=None, help="comma list of case names")
    parser.add_argument("--case_timeout", type=float, default=600,
                        help="seconds for one case's process (default %(default)s)")
    args = parser.parse_args()
    if args.case:
        fields = json.loads(args.case)
        fields["attn_types"] = tuple(fields["attn_types"])
        print(json.dumps(measure(Case(**fields), args.device)))
        return
    cases = {c.name: c for c in (*FULL, *LARGE)}
    chosen = QUICK if args.quick else (LARGE if args.device == "cuda" else ()) + FULL
    if args.only:
        chosen = tuple(cases[name] for name in args.only.split(","))
    results = []
    for case in chosen:
        try:
            results.append(run_case(case, args.device, args.case_timeout))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            results.append({"case": case.name, "device": args.device, "error": str(exc)})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    json.dump({"bench": "plan_check", "device": args.device, "results": results},
              sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
