"""`resume P`: a run stopped by SIGTERM after step k and continued with --resume auto ends
with the weights of a run never stopped.

Every phase is a `dalle-dist train` command line, exactly what a user (or a cluster
scheduler's preemption) does: train; stop (SIGTERM: finish the step, save, exit 0);
`--resume auto` with the same output name; compare its NAME.pt with the uninterrupted
run's. Dropout is on, so the random streams the resumed run restores decide the weights
too: a resume that forgot them would not end on the same weights. On CUDA, kernels are
not bit for bit repeatable even in deterministic mode, so a third, uninterrupted
"control" run measures how close two uninterrupted runs are, and the resumed run must be
at least that close.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from dalle_dist.selftest.models import DALLE_FLAGS, MODELS, save_fresh_vae
from dalle_dist.selftest.report import Check, Report
from dalle_dist.selftest.runs import run_specs

#: dropout of the resume check's DALL-E (attention and feed-forward)
DROPOUT = 0.1


def train_argv(model: dict[str, Any], vae_path: Path, output: Path, precision: str,
               batch: int, steps: int, device: torch.device, resume: bool) -> list[str]:
    """The `dalle-dist train` command line of one phase: one epoch of `steps` batches of
    the built-in shapes on the `single` backend, metrics every step, no sample grids, no
    saves but the ones the loop always makes (first, at a stop, at the end)."""
    argv = ["train", "--vae_path", str(vae_path), "--dalle_output_file_name", str(output),
            *(f"--{key}={model[key]}" for key in DALLE_FLAGS),
            "--attn_dropout", str(DROPOUT), "--ff_dropout", str(DROPOUT),
            "--truncate_captions", "--shapes_count", str(steps * batch),
            "--batch_size", str(batch), "--epochs", "1", "--learning_rate", "1e-3",
            "--seed", "42", "--clip_grad_norm", "0.5", "--log_every_n_steps", "1",
            "--save_every_n_steps", "0", "--sample_every_n_steps", "0",
            "--fidelity_images", "0", "--distributed_backend", "single",
            "--precision", precision]
    if device.type == "cpu":
        argv += ["--device", "cpu"]  # on CUDA: the default, the rank's GPU
    if resume:
        argv += ["--resume", "auto"]
    return argv


def resume_checks(report: Report, device: torch.device, quick: bool, folder: Path) -> None:
    """Per precision: straight, stopped-at-k and resumed runs of the `single` backend."""
    from dalle_dist.checkpoint.load import load_checkpoint

    cuda = device.type == "cuda"
    precisions = ("bf16", "fp16") if cuda else ("fp32",) if quick else ("fp32", "bf16")
    batch, steps, stop_at = (8, 12, 5) if cuda else (4, 6, 3)
    model = MODELS[device.type]
    vae_path = save_fresh_vae(model, folder / "resume-vae.pt")
    # cuBLAS repeats itself only with a fixed workspace (torch's deterministic mode asks it)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if cuda else None
    phases = ("straight", "interrupted", "control") if cuda else ("straight", "interrupted")

    def spec(precision: str, phase: str) -> dict[str, Any]:
        # the interrupted run and its continuation share one output name, as a user's do
        name = "resumed" if phase in ("interrupted", "resumed") else phase
        output = folder / f"resume-{precision}-{name}.pt"
        return {"kind": "resume", "phase": phase, "output": str(output), "deterministic": cuda,
                "stop_at": stop_at if phase == "interrupted" else None,
                "argv": train_argv(model, vae_path, output, precision, batch, steps, device,
                                   resume=phase == "resumed")}

    started = time.perf_counter()
    first = [spec(p, phase) for p in precisions for phase in phases]
    first_out = run_specs("single", first, folder, timeout=600, env=env)
    second = [spec(p, "resumed") for p in precisions]
    second_out = run_specs("single", second, folder, timeout=600, env=env)
    seconds = round((time.perf_counter() - started) / len(precisions), 2)
    for i, precision in enumerate(precisions):
        outs = {phase: first_out[i * len(phases) + j] for j, phase in enumerate(phases)}
        outs["resumed"] = second_out[i]
        name = f"resume {precision}"
        broken = [f"{phase}: {o.get('error', '')[-400:]}" for phase, o in outs.items()
                  if not o.get("ok")]
        if broken:
            report.add(Check(name, "FAIL", "; ".join(broken), {"phases": outs}, seconds=seconds))
            continue
        if not outs["interrupted"]["stopped"] or outs["resumed"]["resumed_from_step"] != stop_at:
            report.add(Check(name, "FAIL", f"expected a stop after step {stop_at} and a resume "
                             "from it", {"phases": outs}, seconds=seconds))
            continue

        def weights(out: dict[str, Any]) -> dict[str, torch.Tensor]:
            return load_checkpoint(out["checkpoint"], out["phase"], "dalle")["weights"]

        straight = weights(outs["straight"])
        diff = max_diff(weights(outs["resumed"]), straight)
        details: dict[str, Any] = {"steps": steps, "stopped_after": stop_at,
                                   "max_abs_diff": diff}
        allowed = 0.0
        if "control" in outs:
            allowed = max_diff(weights(outs["control"]), straight)
            details["two_uninterrupted_runs_max_abs_diff"] = allowed
        ok = diff <= allowed
        summary = (f"stopped after step {stop_at} of {steps}, resumed: weights "
                   + ("identical" if diff == 0 else f"differ by {diff:.3g}")
                   + (f" (two straight runs: {allowed:.3g})" if "control" in outs else ""))
        report.add(Check(name, "PASS" if ok else "FAIL", summary, details, seconds=seconds))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts (inf: other keys)."""
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
