"""The figures of `dalle-dist selftest` a GPU user compares with published ones: training
tokens/s per GPU and MFU, and sampling image tokens/s, for a DALL-E the size of
LlamaGen-B (about 110M parameters, 256 image tokens) in bf16; and what `train --compile`
gains on that training run (its speed-up, compile time and the steps that pay for it).

They are figures, not thresholds: a check PASSes when its run completes (training with a
finite loss) and reports its numbers, and FAILs when it crashes or the loss is not finite.
The published anchor goes into each check's summary and details, so the reader compares.

Training is `train single bf16`'s run (worker.train_run: the library's own loop, timed
after a warm-up, MFU against the bf16 matmul peak this selftest measured) at this size,
in its own rank process as a user starts one, then again with its blocks compiled
(`train --compile`, inductor) in the same process; sampling is `generate --precision
bf16`'s path (the DALL-E cast to bf16, decoding through the static KV cache, eager) in this
process.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from dalle_dist.selftest.checks import sync
from dalle_dist.selftest.mfu import datasheet_bf16_peak, training_flops_per_step
from dalle_dist.selftest.models import model_configs
from dalle_dist.selftest.report import NO_CUDA, Check, Outcome, Report, guarded
from dalle_dist.selftest.runs import run_specs

if TYPE_CHECKING:
    from pathlib import Path

    from dalle_dist.model import DALLEConfig

#: DALL-E dim 768, 12 heads x 64, 64 text + 16 x 16 = 256 image tokens, an 8192-token VAE:
#: 107.6M parameters. LlamaGen-B (dim 768, 12 heads) has 12 layers of a SwiGLU 8/3 x dim
#: wide; our GEGLU is 4 x dim wide, so 10 layers give about its parameters and its FLOPs
#: per token (6.0 x parameters here). 64 px images through 2 VAE layers: the untrained VAE
#: only has to turn images into 256 tokens, and a small image keeps its cost out of the way.
FIGURES_MODEL = {"dim": 768, "depth": 10, "heads": 12, "dim_head": 64, "text_seq_len": 64,
                 "image_size": 64, "num_layers": 2, "num_tokens": 8192}
#: (batch, steps, warmup, log_every). CUDA: training_flops_per_step(FIGURES_MODEL, 32) is
#: 6.41 TFLOP, so at 30% of an H100's 990 TFLOP/s bf16 a step takes 22 ms: 60 steps 1.3 s,
#: 25 (quick) 0.5 s. The section's time is mostly fixed costs: the rank process's start
#: and CUDA context (~10 s), rendering the shapes, and four eager decodes of 256 tokens
#: (~1 s each): about 25 s in all, 20 s quick; the full run's compiled copy adds its 60
#: steps and inductor's compile of one block graph (estimated at 30 s, until a GPU report
#: gives it). "cpu": only for a `model` override (tests).
TRAIN_SIZES = {"full": (32, 60, 10, 10), "quick": (32, 25, 5, 10), "cpu": (4, 6, 2, 2)}
SAMPLING_BATCHES = (1, 8)
#: The rank process's limit: far above the estimate, for a first start that builds caches;
#: the compiled run adds its own (inductor compiles the block's forward and backward).
TRAIN_TIMEOUT_S, COMPILE_TIMEOUT_S = 300.0, 300.0
#: The published figure to compare with. 140k tokens/s x 6 x 111M FLOPs = 93 TFLOP/s, 30%
#: of an A100's 312 TFLOP/s datasheet bf16 peak: its tokens are the trained sequence
#: positions, 256 image tokens behind one class token, each at 6 x parameters FLOPs.
ANCHOR = {"model": "LlamaGen-B", "parameters": 111e6, "image_tokens": 256, "gpu": "A100",
          "tokens_per_s_per_gpu": 140_000, "mfu": 0.30, "mfu_against": "datasheet peak"}
ANCHOR_TEXT = "LlamaGen-B (111M, 256 tokens): ~140k tokens/s per A100 at ~30% MFU"
#: `figures compile`'s torch.compile backend: inductor on CUDA (what train --compile runs);
#: aot_eager for the CPU's tiny model (tests), whose C++ compile would take longer than
#: the rest of the section (inductor's CPU numerics: tests/train/test_compile.py). Its
#: compile happens at step 2, inside the warm-up: the timed steps are compiled ones.
FIGURE_COMPILERS = {"cuda": "inductor", "cpu": "aot_eager"}


def parameter_count(cfg: DALLEConfig) -> int:
    """The DALL-E's parameters, counted on the meta device (no memory, no init)."""
    from dalle_dist.model import DALLE

    with torch.device("meta"):
        return sum(p.numel() for p in DALLE(cfg).parameters())


def size_label(parameters: int) -> str:
    """107_600_000 -> "108M"; 27_000 -> "27k"."""
    return f"{parameters / 1e6:.0f}M" if parameters >= 1e6 else f"{parameters / 1e3:.0f}k"


def figures_section(report: Report, device: torch.device, peaks: dict[str, float],
                    folder: Path, quick: bool, model: dict[str, Any] | None = None) -> None:
    """`figures train N bf16`, `figures compile N bf16` and `figures sampling N bf16` (N:
    the parameter count, rounded): FIGURES_MODEL on CUDA, not run on a CPU unless `model`
    (a selftest model dict, models.model_configs) overrides it; the compiled run is left
    out of --quick on CUDA (its compile would take most of the quick run's budget).
    `peaks`: matmul_peaks' FLOP/s per dtype (the training MFU is held against "bf16");
    `folder`: where the rank's spec and result files go."""
    cuda = device.type == "cuda"
    chosen = FIGURES_MODEL if model is None else model
    dalle_cfg, _ = model_configs(chosen)
    parameters = parameter_count(dalle_cfg)
    label = f"{size_label(parameters)} bf16"
    train_name, sampling_name = f"figures train {label}", f"figures sampling {label}"
    compile_name = f"figures compile {label}"
    if not cuda and model is None:
        for name in (train_name, compile_name, sampling_name):
            report.add(Check(name, NO_CUDA, cuda_only=True))
        return
    compiler = None if quick and cuda else FIGURE_COMPILERS[device.type]
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    try:
        runs = run_train(device, chosen, peaks, folder, quick, compiler)
        outcome = train_figure(runs[0], dalle_cfg, parameters, datasheet_peak(device))
    except Exception as exc:  # the spec itself could not be run
        outcome = ("FAIL", f"{type(exc).__name__}: {exc}", {"anchor": ANCHOR})
    report.add_outcome(train_name, outcome, True, started)
    if compiler is None:
        report.add(Check(compile_name, "not run: --quick (train --compile's compile takes "
                         "most of its budget)", cuda_only=True))
    else:
        report.add_outcome(compile_name, compile_figure(runs[0] if runs else {},
                                                        runs[1] if len(runs) > 1 else {}),
                           True)
    guarded(report, sampling_name, True, lambda: sampling_figure(chosen, device))


def datasheet_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return datasheet_bf16_peak(torch.cuda.get_device_properties(device).name)


def run_train(device: torch.device, model: dict[str, Any], peaks: dict[str, float],
              folder: Path, quick: bool, compiler: str | None = None
              ) -> list[dict[str, Any]]:
    """The training run's result (worker.train_run's numbers, or ok False and an error),
    and with `compiler` (a torch.compile backend) the same run's with its blocks
    compiled, from the same rank process."""
    from dalle_dist.data.loader import default_num_workers
    from dalle_dist.train.config import TrainConfig

    batch, steps, warmup, log_every = TRAIN_SIZES[
        "cpu" if device.type != "cuda" else "quick" if quick else "full"]
    # `dalle-dist train`'s loader processes on this device; a step of this model on a GPU
    # is about as long as rendering its batch of shapes, so loading in the rank's own
    # process would measure the renderer
    spec = {"kind": "train", "backend": "single", "zero_stage": None, "precision": "bf16",
            "device": device.type, "model": model, "batch": batch, "steps": steps,
            "warmup": warmup, "log_every": log_every,
            "clip": TrainConfig().clip_grad_norm, "peaks": peaks,
            "workers": default_num_workers(device, 1)}
    # with a compiled copy, both runs profile one step after their timed ones: what the
    # compiled step spends its time on, beside the eager step's (step_profile.py)
    specs = ([spec] if compiler is None
             else [{**spec, "profile": True}, {**spec, "compile": compiler, "profile": True}])
    outs = run_specs("single", specs, folder,
                     timeout=TRAIN_TIMEOUT_S + (COMPILE_TIMEOUT_S if compiler else 0))
    for out in outs:
        out["loader_workers_asked"] = spec["workers"]  # worker.train_run reads it
    return outs


def train_figure(out: dict[str, Any], cfg: DALLEConfig, parameters: int,
                 datasheet: float | None) -> Outcome:
    """The training figure from its rank's numbers: tokens/s counted two ways (image
    tokens, as LlamaGen counts its 256-token sequence; and every position trained, text
    and image), MFU against the measured bf16 peak and, where known, the datasheet's."""
    if not out.get("ok"):
        return "FAIL", out.get("error", "the run failed")[-500:], {"anchor": ANCHOR, "run": out}
    losses = out["logged_losses"]
    if not losses or not all(math.isfinite(x) for x in losses):
        return "FAIL", f"loss not finite: {losses}", {"anchor": ANCHOR, "run": out}
    samples_per_s = out["samples_per_s"] / out.get("world_size", 1)  # per GPU
    image_tokens_per_s = samples_per_s * cfg.image_seq_len
    tokens_per_s = samples_per_s * (cfg.text_seq_len + cfg.image_seq_len)
    achieved = training_flops_per_step(cfg, 1) * samples_per_s  # FLOP/s
    details: dict[str, Any] = {
        "parameters": parameters, "image_tokens_per_sample": cfg.image_seq_len,
        "text_tokens_per_sample": cfg.text_seq_len,
        "image_tokens_per_s": round(image_tokens_per_s), "tokens_per_s": round(tokens_per_s),
        "tokens_counted": "image_tokens_per_s: image tokens only (LlamaGen's sequence is its "
                          "256 image tokens behind one class token); tokens_per_s: text + "
                          "image positions, all of which train and which MFU counts",
        "samples_per_s_per_gpu": samples_per_s, "achieved_tflops": round(achieved / 1e12, 3),
        "mfu_measured_peak": out.get("mfu"), "datasheet_bf16_peak_tflops":
            round(datasheet / 1e12) if datasheet else None,
        "mfu_datasheet_peak": round(achieved / datasheet, 4) if datasheet else None,
        "matmul_dtypes": out["matmul_dtypes"],
        "loader_workers_asked": out.get("loader_workers_asked"),
        "anchor": ANCHOR, "run": out,
    }
    mfu = f", MFU {out['mfu']:.3g} of the measured bf16 peak" if "mfu" in out else ""
    if datasheet:
        mfu += f" ({achieved / datasheet:.3g} of the datasheet's {datasheet / 1e12:.0f} TFLOP/s)"
    return "PASS", (f"{size_label(parameters)} parameters, batch {out['batch']}: "
                    f"{image_tokens_per_s / 1e3:.1f}k image tokens/s per GPU "
                    f"({tokens_per_s / 1e3:.1f}k text + image){mfu}; loss {losses[0]:.3f} "
                    f"-> {losses[-1]:.3f}; anchor: {ANCHOR_TEXT}"), details


def compile_figure(eager: dict[str, Any], compiled: dict[str, Any]) -> Outcome:
    """`train --compile`'s figure from the two runs' numbers (same model, batch, data and
    seed; the compiled one's blocks compiled at step 2, inside the warm-up): the speed-up
    of the timed steps, the compile time (the compiling step's time less the next one's,
    train/compile.py) and the steps after which the faster steps have paid for it (none
    when compiled steps are not faster); in its details, each run's profiled step (its
    top kernels: step_profile.py), which says where a slower compiled step loses. FAIL
    when the compiled run fails, its loss is not finite, or it compiled nothing; a
    figure, not a threshold, otherwise."""
    if not compiled.get("ok"):
        return "FAIL", compiled.get("error", "the compiled run failed")[-500:], {"run": compiled}
    losses = compiled["logged_losses"]
    if not losses or not all(math.isfinite(x) for x in losses):
        return "FAIL", f"loss not finite: {losses}", {"run": compiled}
    info = compiled.get("compile") or {}
    if not info.get("graphs") or info.get("seconds") is None:
        return "FAIL", f"nothing compiled, or its time not measured: {info}", {"run": compiled}
    if not eager.get("ok"):
        return "FAIL", "the eager run failed: no speed-up to compare", {"run": compiled}
    eager_s, compiled_s, seconds = eager["step_s"], compiled["step_s"], info["seconds"]
    speedup = eager_s / compiled_s
    gain = eager_s - compiled_s
    pays_off = math.ceil(seconds / gain) if gain > 0 else None
    details = {"speedup": round(speedup, 3), "compile_s": round(seconds, 1),
               "pays_off_after_steps": pays_off, "eager_step_s": eager_s,
               "compiled_step_s": compiled_s, "eager_mfu": eager.get("mfu"),
               "compiled_mfu": compiled.get("mfu"), "eager_losses": eager["logged_losses"],
               "compiled_losses": losses, "compile": info,
               "eager_profile": eager.get("profile"), "compiled_profile": compiled.get("profile"),
               "run": compiled}
    after = (f"pays for its compile after {pays_off} steps" if pays_off is not None
             else "never pays for its compile here")
    return "PASS", (f"train --compile ({info['backend']}, {info['graphs']} graph(s) for "
                    f"{info['blocks']} blocks): {speedup:.2f}x the eager step ({eager_s * 1e3:.1f}"
                    f" -> {compiled_s * 1e3:.1f} ms), compiled in {seconds:.0f} s: {after}"
                    ), details


def sampling_figure(model: dict[str, Any], device: torch.device) -> Outcome:
    """Image tokens/s of `generate --precision bf16`'s decoding (the DALL-E cast to bf16,
    one StaticDecoder per batch size, eager) at each of SAMPLING_BATCHES: one warm-up
    decode, then one timed. The DALL-E is untrained: decoding costs the same whatever the
    weights say."""
    from dalle_dist.model import DALLE
    from dalle_dist.model.decoding import StaticDecoder

    cfg, _ = model_configs(model)
    with torch.random.fork_rng(devices=[]):  # the caller's random streams stay untouched
        torch.manual_seed(0)
        dalle = DALLE(cfg).to(device=device, dtype=torch.bfloat16).eval()
        text = torch.randint(1, cfg.num_text_tokens, (max(SAMPLING_BATCHES), cfg.text_seq_len))
    text[:, cfg.text_seq_len // 2:] = 0  # half-length captions, the rest padding
    text = text.to(device)
    generator = torch.Generator(device)
    n = dalle.layout.image_len
    details: dict[str, Any] = {"image_tokens": n,
                               "parameters": sum(p.numel() for p in dalle.parameters())}
    parts, bad = [], []
    for batch in SAMPLING_BATCHES:
        decoder = StaticDecoder(dalle, batch)
        rows = text[:batch]
        dalle.sample_image_tokens(rows, 0.9, 1.0, generator.manual_seed(0), decoder=decoder)
        sync(device)
        start = time.perf_counter()
        tokens = dalle.sample_image_tokens(rows, 0.9, 1.0, generator.manual_seed(1),
                                           decoder=decoder)
        sync(device)
        seconds = time.perf_counter() - start
        if not (tokens.shape == (batch, n) and 0 <= int(tokens.min())
                and int(tokens.max()) < cfg.num_image_tokens):
            bad.append(f"batch {batch}: tokens {tuple(tokens.shape)} outside the codebook")
        details[f"batch_{batch}"] = {"image_tokens_per_s": round(batch * n / seconds, 1),
                                     "seconds_per_image": round(seconds / batch, 4),
                                     "ms_per_decode_step": round(seconds / n * 1e3, 3)}
        parts.append(f"batch {batch} {batch * n / seconds:.0f}")
    if bad:
        return "FAIL", "; ".join(bad), details
    return "PASS", (f"image tokens/s through the bf16 KV cache: {', '.join(parts)} "
                    f"({n} tokens per image)"), details
