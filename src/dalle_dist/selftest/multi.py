"""The multi-GPU checks of `dalle-dist selftest`: several ranks on this machine, each
backend under its own launcher, against one process.

On a machine with two or more GPUs (or on the CPU with --ranks N, over gloo), N ranks
(every GPU, rounded down to a power of two, at most 8) train the same model, seed and
global batch as one process does, and:

  multi B P        for torch DDP and FSDP2 in bf16 and fp16, DeepSpeed ZeRO-2 in bf16 (its
                   launcher) and Horovod (horovodrun, where it is built for this device):
                   the first step's pre-clip gradient norm equals the one process's
                   (GRAD_NORM_FACTOR: a gradient summed instead of averaged is off by N),
                   the final weights equal it (weights_error within WEIGHTS_TOLERANCE:
                   ranks that trained on the same samples, or one rank's gradient left out,
                   end elsewhere), and samples/s and MFU per GPU
  host syncs multi B P   (CUDA) no synchronizing call on a quiet step, for DDP and FSDP2
  hung peer        one rank stops itself (SIGSTOP) mid-run; the others must print the
                   one-line error naming their wait within --collective_timeout + 10 s
                   (on CUDA: an NCCL collective returns at once and the host blocks later,
                   which is what the watchdog thread is for)

The one-process references run here too (the `single` backend, same sizes), so the
section stands alone and `--quick` can leave the training section's runs out.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dalle_dist.selftest.models import MODELS
from dalle_dist.selftest.report import Check, Report
from dalle_dist.selftest.runs import WORKER_MODULE, launch, launch_line, run_specs
from dalle_dist.selftest.training import run_label, skip_reason, sync_check

#: (global batch, steps, warmup, log_every) of the multi-rank runs and their references
MULTI_SIZES = {"cuda": (16, 12, 4, 4), "cpu": (8, 4, 1, 2)}
#: (backend, ZeRO stage, precision) trained on N ranks
MULTI_RUNS = (("torch", None, "bf16"), ("torch", None, "fp16"), ("fsdp", None, "bf16"),
              ("fsdp", None, "fp16"), ("deepspeed", 2, "bf16"), ("horovod", None, "bf16"))
#: --quick: each backend once, each half precision at least once
QUICK_MULTI_RUNS = {("torch", None, "bf16"), ("fsdp", None, "fp16"), ("deepspeed", 2, "bf16"),
                    ("horovod", None, "bf16")}
#: which launcher process runs a backend's specs (DDP and FSDP share torchrun's)
LAUNCH_GROUP = {"torch": "torch", "fsdp": "torch", "deepspeed": "deepspeed",
                "horovod": "horovod"}
#: The unit roundoff of the matmuls' dtype (the runs are all half precision).
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
#: The first step's gradient norm, N ranks against one process: the same gradients
#: summed in another order (the batch split over ranks, the all-reduce's tree) differ by
#: a few roundings of the matmul dtype per element, through a few layers: 16 unit
#: roundoffs bound it (bf16 6.3%, fp16 0.8%; measured on the CPU with 2 ranks: 5e-5 and
#: 4e-5). The bugs it is for are factors: N (summed instead of averaged), 1/N (one rank's
#: gradient alone); Adam and clipping hide both in the weights.
GRAD_NORM_FACTOR = 16
#: weights_error allowed after MULTI_SIZES' steps. Measured on the CPU (2 ranks over gloo
#: against one process, --quick's sizes): 0.0033 in bf16, 0.0062 in fp16; the same run
#: with one rank's half of the batch alone (a gradient not averaged in, or both ranks on
#: the same samples) ends 0.40 away. 0.1 sits 4x below the bug and 16x above the noise.
WEIGHTS_TOLERANCE = 0.1
#: --collective_timeout of the hung-peer run, and the slack the error line may take
HUNG_TIMEOUT_S, HUNG_SLACK_S = {"cuda": 30, "cpu": 10}, 10
LOST_LINE = re.compile(r"error: rank (\d+) waited (\d+) s in (.+?) for the other ranks")


def multi_world(device: torch.device, ranks: int | None) -> tuple[int, str | None]:
    """(ranks to launch, why not), from --ranks or this machine's GPUs: a power of two
    (the global batch splits evenly), at most 8 (one node)."""
    if ranks is None:
        if device.type != "cuda":
            return 0, "not run: no CUDA (--ranks 2 runs it on the CPU over gloo)"
        ranks = torch.cuda.device_count()
        if ranks < 2:
            return 0, f"not run: {ranks} GPU (needs 2 or more)"
        ranks = min(8, 2 ** int(math.log2(ranks)))
    if ranks < 2:
        return 0, "not run: --ranks below 2"
    return ranks, None


def weights_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                  initial: dict[str, torch.Tensor]) -> float:
    """|got - want| / |want - initial| (L2 over all weights): how far from the reference
    run's weights, relative to how far that run moved them."""
    if got.keys() != want.keys() or want.keys() != initial.keys():
        return math.inf
    apart = sum(float((got[k] - want[k]).pow(2).sum()) for k in want)
    moved = sum(float((want[k] - initial[k]).pow(2).sum()) for k in want)
    return math.sqrt(apart / moved) if moved > 0 else math.inf


def multi_verdict(out: dict[str, Any], reference: dict[str, Any], precision: str
                  ) -> tuple[str, str, dict[str, Any]]:
    """`multi B P` from the N-rank run's numbers and the one process's."""
    if not out.get("ok"):
        return "FAIL", out.get("error", "the run failed")[-500:], {}
    if not reference.get("ok"):
        return "FAIL", "the one-process reference failed: " + reference.get("error", "")[-400:], {}
    norm_rtol = GRAD_NORM_FACTOR * UNIT_ROUNDOFF[precision]
    pairs = [(a, b) for a, b in zip(out["grad_norms"], reference["grad_norms"], strict=False)
             if math.isfinite(a) and math.isfinite(b)]
    got = torch.load(out["weights"], weights_only=True)
    want = torch.load(reference["weights"], weights_only=True)
    error = weights_error(got["final"], want["final"], want["initial"])
    details: dict[str, Any] = {
        "world_size": out["world_size"], "grad_norms": out["grad_norms"],
        "reference_grad_norms": reference["grad_norms"], "grad_norm_rtol": norm_rtol,
        "weights_error": error, "weights_tolerance": WEIGHTS_TOLERANCE,
        "samples_per_s": out["samples_per_s"], "mfu_per_gpu": out.get("mfu"),
        "achieved_tflops": out.get("achieved_tflops"),
        "matmul_dtypes": out["matmul_dtypes"]}
    if not pairs:
        return "FAIL", "no finite gradient norm to compare", details
    first, ref_first = pairs[0]
    norm_err = abs(first - ref_first) / max(abs(ref_first), 1e-30)
    details["first_grad_norm_rel_err"] = norm_err
    speed = f"{out['samples_per_s']} samples/s" + (
        f", MFU {out['mfu']:.3f} per GPU" if "mfu" in out else "")
    if not norm_err <= norm_rtol:
        return "FAIL", (f"first gradient norm {first:.5g} against one process's "
                        f"{ref_first:.5g} (relative {norm_err:.3g} > {norm_rtol:.3g})"), details
    if not error <= WEIGHTS_TOLERANCE:
        return "FAIL", (f"weights {error:.3g} of the one process's updates away from its "
                        f"(tolerance {WEIGHTS_TOLERANCE})"), details
    return "PASS", (f"{out['world_size']} ranks equal one process (gradient norm "
                    f"{norm_err:.2g}, weights {error:.2g}); {speed}"), details


def multi_section(report: Report, device: torch.device, quick: bool, peaks: dict[str, float],
                  folder: Path, ranks: int | None, timeout: float,
                  runs: Sequence[tuple[str, int | None, str]] | None = None) -> None:
    """Every MULTI_RUNS entry (QUICK_MULTI_RUNS' with `quick`; or `runs`) this machine can
    run on N ranks, its reference, and the hung-peer check; "not run" lines with the
    reason otherwise."""
    cuda = device.type == "cuda"
    world, why = multi_world(device, ranks)
    if runs is None:
        runs = [r for r in MULTI_RUNS if not quick or r in QUICK_MULTI_RUNS]
    if why is not None:  # checks for GPU machines: on the CPU only when asked (--ranks)
        for backend, stage, precision in runs:
            report.add(Check(f"multi {run_label(backend, stage)} {precision}", why,
                             cuda_only=True))
        report.add(Check("hung peer", why, cuda_only=True))
        return
    batch, steps, warmup, log_every = MULTI_SIZES[device.type]
    model = MODELS[device.type]

    def spec(backend: str, stage: int | None, precision: str) -> dict[str, Any]:
        per_rank = backend == "horovod"  # Horovod's --batch_size is per rank
        return {"kind": "train", "backend": backend, "zero_stage": stage,
                "precision": precision, "device": device.type, "model": model,
                "batch": batch // world if per_rank else batch, "steps": steps,
                "warmup": warmup, "log_every": log_every, "clip": 0.5, "peaks": peaks,
                "weights_out": str(folder / f"weights-{backend}-{stage}-{precision}-"
                                   f"{time.monotonic_ns()}.pt")}

    wanted: list[tuple[str, int | None, str]] = []
    for backend, stage, precision in runs:
        reason = skip_reason(backend, stage, precision, device, quick=False)
        if reason is None and skip_reason("single", None, precision, device, False):
            reason = skip_reason("single", None, precision, device, False)
        if reason:
            report.add(Check(f"multi {run_label(backend, stage)} {precision}", reason))
        else:
            wanted.append((backend, stage, precision))
    precisions = sorted({p for _, _, p in wanted})
    started = time.perf_counter()
    references = dict(zip(precisions, run_specs(
        "single", [spec("single", None, p) for p in precisions], folder, timeout),
        strict=True)) if precisions else {}
    groups: dict[str, list[tuple[str, int | None, str]]] = {}
    for key in wanted:
        groups.setdefault(LAUNCH_GROUP[key[0]], []).append(key)
    outs: dict[tuple[str, int | None, str], dict[str, Any]] = {}
    for group, keys in groups.items():
        results = run_specs(group, [spec(*key) for key in keys], folder, timeout, nproc=world)
        outs.update(zip(keys, results, strict=True))
    seconds = round((time.perf_counter() - started) / max(len(wanted), 1), 2)
    for key in wanted:
        backend, stage, precision = key
        label = f"{run_label(backend, stage)} {precision}"
        status, summary, details = multi_verdict(outs[key], references[precision], precision)
        report.add(Check(f"multi {label}", status, summary, details, seconds=seconds))
        if cuda:
            report.add(sync_check(f"multi {label}", outs[key], backend, cuda))
    report.add(hung_peer_check(device, world, folder, timeout))


def hung_peer_argv(model: dict[str, Any], vae_path: Path, output: Path, device: torch.device,
                   steps: int, batch: int) -> list[str]:
    """The `dalle-dist train` line of the hung-peer run: torch DDP, metrics every step."""
    from dalle_dist.selftest.models import DALLE_FLAGS

    argv = ["train", "--vae_path", str(vae_path), "--dalle_output_file_name", str(output),
            *(f"--{key}={model[key]}" for key in DALLE_FLAGS), "--truncate_captions",
            "--shapes_count", str(steps * batch), "--batch_size", str(batch), "--epochs", "1",
            "--log_every_n_steps", "1", "--save_every_n_steps", "0",
            "--sample_every_n_steps", "0", "--fidelity_images", "0",
            "--distributed_backend", "torch",
            "--collective_timeout", str(HUNG_TIMEOUT_S[device.type])]
    if device.type == "cpu":
        argv += ["--device", "cpu"]
    return argv


def hung_peer_check(device: torch.device, world: int, folder: Path, timeout: float) -> Check:
    """`hung peer`: the last rank stops itself after step 2 of a DDP run; the survivors
    must end with the error line naming their wait within --collective_timeout + slack."""
    import json

    from dalle_dist.selftest.models import save_fresh_vae

    model = MODELS[device.type]
    limit = HUNG_TIMEOUT_S[device.type] + HUNG_SLACK_S
    vae_path = save_fresh_vae(model, folder / "hung-vae.pt")
    stopped_file = folder / "hung-stopped-at"
    specs = [{"kind": "hung_peer", "victim": world - 1, "stop_at": 2,
              "stopped_file": str(stopped_file), "result": str(folder / "hung-result.json"),
              "argv": hung_peer_argv(model, vae_path, folder / "hung", device, 50,
                                     2 * world)}]
    spec_file = folder / "hung-specs.json"
    spec_file.write_text(json.dumps(specs))
    started = time.perf_counter()
    done = launch([*launch_line("torch", world), WORKER_MODULE, str(spec_file)], folder,
                  timeout=min(timeout, 120 + limit), until=lambda line: bool(
                      LOST_LINE.search(line)))
    seconds = round(time.perf_counter() - started, 2)
    details: dict[str, Any] = {"ranks": world, "collective_timeout_s": HUNG_TIMEOUT_S[
        device.type], "limit_s": limit, "launch": done.note, "tail": done.text[-1500:]}
    if not stopped_file.exists():
        return Check("hung peer", "FAIL", f"rank {world - 1} never reached step 2 ({done.note})",
                     details, seconds=seconds)
    stopped_at, pid = stopped_file.read_text().split()
    with contextlib.suppress(ProcessLookupError):  # torchrun runs its ranks in their own
        os.kill(int(pid), signal.SIGKILL)  # sessions: killing the launch's leaves it stopped
    stopped_at = float(stopped_at)
    details["victim_pid"] = int(pid)
    said = [(t, m) for t, line in done.lines if (m := LOST_LINE.search(line))]
    if not said:
        return Check("hung peer", "FAIL", f"no rank named its wait ({done.note})", details,
                     seconds=seconds)
    at, match = said[0]
    after = at - stopped_at
    details.update(after_stop_s=round(after, 1), line=match.group(0))
    status = "PASS" if after <= limit else "FAIL"
    return Check("hung peer", status, f"rank {match.group(1)} said it waited in "
                 f"{match.group(3)} {after:.0f} s after the stop (limit {limit} s)", details,
                 seconds=seconds)
