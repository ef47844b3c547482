"""The figures of `dalle-dist selftest` a GPU user compares with published ones: training
tokens/s per GPU and MFU, and sampling image tokens/s, for a DALL-E the size of
LlamaGen-B (about 110M parameters, 256 image tokens) in bf16.

They are figures, not thresholds: a check PASSes when its run completes (training with a
finite loss) and reports its numbers, and FAILs when it crashes or the loss is not finite.
The published anchor goes into each check's summary and details, so the reader compares.

Training is `train single bf16`'s run (worker.train_run: the library's own loop, timed
after a warm-up, MFU against the bf16 matmul peak this selftest measured) at this size,
in its own rank process as a user starts one; sampling is `generate --precision bf16`'s
path (the DALL-E cast to bf16, decoding through the static KV cache, eager) in this process.
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
#: (~1 s each): about 25 s in all, 20 s quick. "cpu": only for a `model` override (tests).
TRAIN_SIZES = {"full": (32, 60, 10, 10), "quick": (32, 25, 5, 10), "cpu": (4, 6, 2, 2)}
SAMPLING_BATCHES = (1, 8)
#: The rank process's limit: far above the estimate, for a first start that builds caches.
TRAIN_TIMEOUT_S = 300.0
#: The published figure to compare with. 140k tokens/s x 6 x 111M FLOPs = 93 TFLOP/s, 30%
#: of an A100's 312 TFLOP/s datasheet bf16 peak: its tokens are the trained sequence
#: positions, 256 image tokens behind one class token, each at 6 x parameters FLOPs.
ANCHOR = {"model": "LlamaGen-B", "parameters": 111e6, "image_tokens": 256, "gpu": "A100",
          "tokens_per_s_per_gpu": 140_000, "mfu": 0.30, "mfu_against": "datasheet peak"}
ANCHOR_TEXT = "LlamaGen-B (111M, 256 tokens): ~140k tokens/s per A100 at ~30% MFU"


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
    """`figures train N bf16` and `figures sampling N bf16` (N: the parameter count,
    rounded): FIGURES_MODEL on CUDA, not run on a CPU unless `model` (a selftest model
    dict, models.model_configs) overrides it. `peaks`: matmul_peaks' FLOP/s per dtype
    (the training MFU is held against "bf16"); `folder`: where the rank's spec and result
    files go."""
    cuda = device.type == "cuda"
    chosen = FIGURES_MODEL if model is None else model
    dalle_cfg, _ = model_configs(chosen)
    parameters = parameter_count(dalle_cfg)
    label = f"{size_label(parameters)} bf16"
    train_name, sampling_name = f"figures train {label}", f"figures sampling {label}"
    if not cuda and model is None:
        report.add(Check(train_name, NO_CUDA, cuda_only=True))
        report.add(Check(sampling_name, NO_CUDA, cuda_only=True))
        return
    started = time.perf_counter()
    try:
        outcome = train_figure(run_train(device, chosen, peaks, folder, quick), dalle_cfg,
                               parameters, datasheet_peak(device))
    except Exception as exc:  # the spec itself could not be run
        outcome = ("FAIL", f"{type(exc).__name__}: {exc}", {"anchor": ANCHOR})
    report.add_outcome(train_name, outcome, True, started)
    guarded(report, sampling_name, True, lambda: sampling_figure(chosen, device))


def datasheet_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return datasheet_bf16_peak(torch.cuda.get_device_properties(device).name)


def run_train(device: torch.device, model: dict[str, Any], peaks: dict[str, float],
              folder: Path, quick: bool) -> dict[str, Any]:
    """The training run's result (worker.train_run's numbers, or ok False and an error)."""
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
    out = run_specs("single", [spec], folder, timeout=TRAIN_TIMEOUT_S)[0]
    out["loader_workers_asked"] = spec["workers"]  # worker.train_run reads spec["workers"]
    return out


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
