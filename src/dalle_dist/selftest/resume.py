"""`resume P`: a run stopped by SIGTERM after step k and continued with --resume auto ends
with the weights of a run never stopped.

Every phase is a `dalle-dist train` command line, exactly what a user (or a cluster
scheduler's preemption) does: train; stop (SIGTERM: finish the step, save, exit 0);
`--resume auto` with the same output name; compare its NAME.pt with the uninterrupted
run's. Dropout is on, so the random streams the resumed run restores decide the weights
too: a resume that forgot them would not end on the same weights.

On CUDA the phases run deterministically (worker.deterministic: deterministic
algorithms, cuDNN without autotuning, SDPA's math kernel), and a third, uninterrupted
"control" run shows whether that made two runs bit for bit equal:
- they are equal: the resumed run must be equal too (max_diff 0), as on the CPU;
- they are not (an op without a deterministic form ran; the worker names it): the resumed
  run is judged by how far it is from the straight one relative to how far the resumed
  part of training moved the weights (resume_error), within RESUME_TOLERANCE, and the
  control run must be within it too (else the machine is too noisy to tell).
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
#: resume_error allowed when two uninterrupted runs are not bit for bit equal. Kernel
#: noise (a sum in another order) moves an fp32 gradient by about 2^-24 x sqrt(terms),
#: some 1e-6 of it, and now and then flips a bf16 rounding of an activation (2^-8 of
#: that element): the updates move by far less than 1% in L2. A resume bug changes
#: whole updates. Measured on the CPU at the CUDA check's counts (dropout 0.1, 12 steps
#: of batch 4, stopped after 5): the random streams not restored 0.034, Adam's moments
#: lost 0.73, the data position lost (the epoch read again from its start) 0.64; at the
#: CPU check's (6 steps, stopped after 3): 0.052, 0.78, 0.87
#: (tests/test_selftest.py::test_resume_verdict_within_tolerance). The subtlest bug,
#: the random streams, stays 3x above the tolerance.
RESUME_TOLERANCE = 0.01


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


def resume_checks(report: Report, device: torch.device, quick: bool, folder: Path,
                  timeout: float = 600) -> None:
    """Per precision: straight, stopped-at-k and resumed runs of the `single` backend."""
    from dalle_dist.checkpoint.load import load_checkpoint

    cuda = device.type == "cuda"
    precisions = {(True, False): ("bf16", "fp16"), (True, True): ("bf16",),
                  (False, False): ("fp32", "bf16"), (False, True): ("fp32",)}[(cuda, quick)]
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
    first_out = run_specs("single", first, folder, timeout=timeout, env=env)
    second = [spec(p, "resumed") for p in precisions]
    second_out = run_specs("single", second, folder, timeout=timeout, env=env)
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

        def weights(path: str, phase: str) -> dict[str, torch.Tensor]:
            return load_checkpoint(path, phase, "dalle")["weights"]

        straight = weights(outs["straight"]["checkpoint"], "straight")
        control = (weights(outs["control"]["checkpoint"], "control") if "control" in outs
                   else None)
        status, summary, details = resume_verdict(
            straight, weights(outs["resumed"]["checkpoint"], "resumed"),
            weights(outs["interrupted"]["checkpoint_at_stop"], "interrupted"), control)
        details.update(steps=steps, stopped_after=stop_at, nondeterministic_ops=sorted(
            {op for o in outs.values() for op in o.get("nondeterministic_ops", [])}))
        report.add(Check(name, status, f"stopped after step {stop_at} of {steps}, resumed: "
                         + summary, details, seconds=seconds))


def resume_error(resumed: dict[str, torch.Tensor], straight: dict[str, torch.Tensor],
                 at_stop: dict[str, torch.Tensor]) -> float:
    """|resumed - straight| / |straight - at_stop| over all weights (L2): the resumed
    run's distance from the uninterrupted one, relative to how far training moved the
    weights after the stop. inf when the keys differ or nothing moved."""
    if resumed.keys() != straight.keys() or straight.keys() != at_stop.keys():
        return math.inf
    apart = sum(float((resumed[k].float() - straight[k].float()).pow(2).sum()) for k in straight)
    moved = sum(float((straight[k].float() - at_stop[k].float()).pow(2).sum()) for k in straight)
    return math.sqrt(apart / moved) if moved > 0 else math.inf


def resume_verdict(straight: dict[str, torch.Tensor], resumed: dict[str, torch.Tensor],
                   at_stop: dict[str, torch.Tensor],
                   control: dict[str, torch.Tensor] | None) -> tuple[str, str, dict[str, Any]]:
    """(status, summary, details) of `resume P` from the runs' weights: bit for bit where
    two uninterrupted runs are (always on the CPU, where there is no control run), else
    within RESUME_TOLERANCE (the module's docstring says why)."""
    diff = max_diff(resumed, straight)
    error = resume_error(resumed, straight, at_stop)
    details: dict[str, Any] = {"max_abs_diff": diff, "resume_error": error}
    control_diff = 0.0 if control is None else max_diff(control, straight)
    if control is not None:
        details["two_uninterrupted_runs_max_abs_diff"] = control_diff
    if control_diff == 0:
        if diff == 0:
            return "PASS", "weights identical" + (" (as two straight runs' are)"
                                                  if control is not None else ""), details
        return "FAIL", (f"weights differ by {diff:.3g} (resume error {error:.3g}) where two "
                        "uninterrupted runs are identical"), details
    assert control is not None
    noise = resume_error(control, straight, at_stop)
    details.update(control_error=noise, tolerance=RESUME_TOLERANCE)
    if noise > RESUME_TOLERANCE:
        return "FAIL", (f"two uninterrupted runs differ by {noise:.3g} of the resumed part's "
                        f"updates (tolerance {RESUME_TOLERANCE}): too noisy to judge a "
                        "resume"), details
    status = "PASS" if error <= RESUME_TOLERANCE else "FAIL"
    return status, (f"resume error {error:.3g} of the resumed part's updates (two straight "
                    f"runs: {noise:.3g}; tolerance {RESUME_TOLERANCE})"), details


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts (inf: other keys)."""
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
