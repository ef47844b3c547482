"""The in-process checks of `dalle-dist selftest` that are not sampling: CUDA reachable,
every attention path against the dense reference, FlexAttention's recompiles.

Each returns an Outcome (report.py): status "PASS", "FAIL" or "not run: <why>", a one-line
summary, and the numbers behind it. They run in the selftest's own process: no launcher
is involved, so a FAIL here is the library's arithmetic, not the machine's set-up.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from dalle_dist.model.vqgan import exact_fp32_matmuls
from dalle_dist.selftest.report import NO_CUDA, Outcome, Report

#: bf16 paths may be this much worse than the dense path in bf16 (both against fp32), plus
#: one bf16 rounding step (2^-7 relative) of slack for a differently ordered sum.
BF16_ERROR_FACTOR, BF16_SLACK = 2.0, 2.0**-7
#: fp32 paths against the fp32 dense reference (TF32 off), relative to the output's scale.
FP32_TOLERANCE = 1e-4


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().clamp_min(1e-12)
    return float((got.float() - ref).abs().max() / scale)


# -- attention ------------------------------------------------------------------------------


def attention_sizes(device: torch.device) -> dict[str, int]:
    """One layer over text + image tokens: 1024 image tokens on CUDA, 256 on the CPU
    (sparse needs enough 16-token blocks to leave some out: at 64 it is plain causal).
    On CUDA the shapes are flex_recompile_check's first ones (FLEX_CHECK_MODEL, batch 2),
    so the bf16 kernels compiled here are the ones it reuses, not compiles again."""
    if device.type == "cuda":
        return {"text_len": FLEX_CHECK_MODEL["text_seq_len"] + 1, "fmap_size": 32,
                "batch": FLEX_BATCHES[0], "heads": FLEX_CHECK_MODEL["heads"],
                "dim_head": FLEX_CHECK_MODEL["dim_head"]}
    return {"text_len": 17, "fmap_size": 16, "batch": 2, "heads": 2, "dim_head": 16}


def _layer_run(layer: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor, layout: Any,
               backward: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(output, input gradient, to_qkv weight gradient) of one forward (+ backward)."""
    x = x.detach().requires_grad_(backward)
    layer.zero_grad(set_to_none=True)
    if not backward:  # no graph at all: FlexAttention refuses inputs that require grad on CPU
        with torch.no_grad():
            return layer(x, layout), None, None
    out = layer(x, layout)
    (out.float() * grad_out).sum().backward()
    return out.detach(), x.grad, layer.to_qkv.weight.grad


def attention_check(pattern_name: str, dtype_name: str, device: torch.device,
                    run_flex: bool, flex_backward: bool, why_no_flex: str) -> Outcome:
    """Every --attn_impl of one pattern through the Attention layer against the dense
    reference (impl "dense" in fp32, TF32 off): output, input and weight gradients."""
    from dalle_dist.model.attention import ATTN_IMPLS, Attention, resolve_impl
    from dalle_dist.model.patterns import SequenceLayout, build_pattern

    sizes = attention_sizes(device)
    layout = SequenceLayout(sizes["text_len"], sizes["fmap_size"])
    dim = sizes["heads"] * sizes["dim_head"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    pattern = build_pattern(pattern_name)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(sizes["batch"], layout.seq_len, dim, generator=generator).to(device)
    grad_out = torch.randn(x.shape, generator=generator).to(device)

    def layer(impl: str, as_dtype: torch.dtype) -> torch.nn.Module:
        torch.manual_seed(0)  # the same weights for every path
        return Attention(dim, sizes["heads"], sizes["dim_head"], 0.0, pattern, impl).to(
            device=device, dtype=as_dtype)

    if not pattern.causal_only:
        mask = pattern.full_mask(layout, layout.seq_len, torch.device("cpu"))
        if bool((mask == torch.ones_like(mask).tril()).all()):
            return "FAIL", (f"{pattern_name} is plain causal attention at {sizes}: the check "
                            "would prove nothing"), {"layout": sizes}
    with exact_fp32_matmuls():
        ref = _layer_run(layer("dense", torch.float32), x, grad_out, layout, True)
        baseline = None
        if dtype is not torch.float32:
            dense = _layer_run(layer("dense", dtype), x.to(dtype), grad_out, layout, True)
            baseline = [rel_err(a, b) for a, b in zip(dense, ref, strict=True)]
        paths: dict[str, Any] = {}
        failed = []
        for impl in ATTN_IMPLS:
            if impl == "dense":
                continue
            path = resolve_impl(impl, pattern, device, layout)
            if path == "flex" and not run_flex:
                paths[impl] = {"path": path, "not_run": why_no_flex}
                continue
            backward = path != "flex" or flex_backward
            got = _layer_run(layer(impl, dtype), x.to(dtype), grad_out, layout, backward)
            errors = [rel_err(a, b) if a is not None else None
                      for a, b in zip(got, ref, strict=True)]
            if baseline is None:
                limits = [FP32_TOLERANCE] * 3
            else:
                limits = [BF16_ERROR_FACTOR * b + BF16_SLACK for b in baseline]
            bad = [name for name, err, limit in zip(("output", "input grad", "weight grad"),
                                                    errors, limits, strict=True)
                   if err is not None and not err <= limit]
            paths[impl] = {"path": path, "output_err": errors[0], "input_grad_err": errors[1],
                           "weight_grad_err": errors[2],
                           "backward": backward if path == "flex" else True}
            if bad:
                failed.append(f"{impl} ({path}): {', '.join(bad)}")
    limits = (f"fp32: {FP32_TOLERANCE:g} of the output scale; bf16: {BF16_ERROR_FACTOR:g} x "
              f"the dense path's own bf16 error + {BF16_SLACK:g}")
    details = {"layout": sizes, "paths": paths, "dense_bf16_err": baseline, "limits": limits}
    ran = ", ".join(f"{impl}->{p['path']}" for impl, p in paths.items() if "not_run" not in p)
    if failed:
        return "FAIL", "differs from the dense reference: " + "; ".join(failed), details
    return "PASS", f"{ran} equal the dense reference (forward + backward)", details


def attention_section(report: Report, device: torch.device, quick: bool) -> None:
    """`attention X D` for every pattern X and dtype D (fp32, bf16; --quick on CUDA bf16
    only: fp32 would compile every FlexAttention kernel a second time), one check each."""
    from dalle_dist.model.patterns import PATTERNS

    cuda = device.type == "cuda"
    why = "" if cuda else ("--quick (compiling FlexAttention on the CPU takes minutes)"
                           if quick else "")
    for dtype in ("bf16",) if quick and cuda else ("fp32", "bf16"):
        for pattern in PATTERNS:
            started = time.perf_counter()
            try:
                outcome = attention_check(pattern, dtype, device, run_flex=not why,
                                          flex_backward=cuda, why_no_flex=why)
            except Exception as exc:
                outcome = ("FAIL", f"{type(exc).__name__}: {exc}", {})
            report.add_outcome(f"attention {pattern} {dtype}", outcome, started=started)


# -- flex recompiles --------------------------------------------------------------------------


def flex_compile_counter() -> Callable[[], int]:
    """How many graphs the one shared FlexAttention kernel has compiled so far in this
    process (model/attention_paths.py flex_compile_stats: each recompile counts once)."""
    from dalle_dist.model.attention_paths import flex_compile_stats

    return lambda: int(flex_compile_stats()["compiles"])


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


#: The flex recompile check's DALL-E (its layers cycle the four FlexAttention patterns).
FLEX_CHECK_MODEL = {"text_seq_len": 64, "dim": 256, "depth": 8, "heads": 4, "dim_head": 64}
#: Its batch sizes in turn: the second must reuse the first's kernels, the third compile
#: its own (--quick stops after the second).
FLEX_BATCHES = (2, 2, 4)


def flex_recompile_check(device: torch.device, quick: bool = False) -> Outcome:
    """A DALL-E whose layers cycle axial_row, axial_col, conv_like and sparse (8 layers, so
    each pattern twice), FlexAttention on every layer, trained forward + backward at one
    batch size twice and then at another: compiles must stay within the distinct
    (pattern, shape) pairs (4 after the first size, 8 after the second), and dynamo must
    never give up on a frame (its recompile limit silently falls back to eager flex)."""
    if device.type != "cuda":
        return NO_CUDA, "", {}
    from dalle_dist.model import DALLE, DALLEConfig

    patterns = ("axial_row", "axial_col", "conv_like", "sparse")
    cfg = DALLEConfig(num_text_tokens=257, num_image_tokens=1024, image_fmap_size=32,
                      attn_types=patterns, **FLEX_CHECK_MODEL)
    torch.manual_seed(0)
    model = DALLE(cfg, "flex").to(device)
    count = flex_compile_counter()
    handler = _Records()
    dynamo_log = logging.getLogger("torch._dynamo")
    dynamo_log.addHandler(handler)
    phases: list[dict[str, Any]] = []
    start = count()
    try:
        for batch in FLEX_BATCHES[:2] if quick else FLEX_BATCHES:
            text = torch.randint(1, 257, (batch, cfg.text_seq_len), device=device)
            image = torch.randint(0, 1024, (batch, 1024), device=device)
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(text, image)["loss"]
            loss.backward()
            model.zero_grad(set_to_none=True)
            sync(device)
            phases.append({"batch": batch, "compiles_so_far": count() - start,
                           "seconds": round(time.perf_counter() - t0, 2)})
    finally:
        dynamo_log.removeHandler(handler)
    limit_hits = [m for m in handler.messages if "recompile_limit" in m
                  or "cache_size_limit" in m or "recompilation limit" in m.lower()]
    bounds = [len(patterns), len(patterns), 2 * len(patterns)][:len(phases)]
    details = {"phases": phases, "bounds": bounds, "limit_warnings": limit_hits[:3],
               "counter": "attention_paths.flex_compile_stats()['compiles']"}
    over = [p for p, bound in zip(phases, bounds, strict=True) if p["compiles_so_far"] > bound]
    total = phases[-1]["compiles_so_far"]
    if over or limit_hits:
        why = (f"{over[0]['compiles_so_far']} compiles after batch {over[0]['batch']}, "
               f"more than the distinct (pattern, shape) pairs" if over else
               "dynamo hit its recompile limit (flex fell back to eager)")
        return "FAIL", why, details
    shapes = len({p["batch"] for p in phases})
    return "PASS", f"{total} compiles for {len(patterns)} patterns x {shapes} shapes", details


# -- CUDA reachable -------------------------------------------------------------------------


def cuda_smoke_check(device: torch.device) -> Outcome:
    """`dalle-dist check --cuda-smoke`, as a user runs it: torch reaches every GPU."""
    if device.type != "cuda":
        return NO_CUDA, "", {}
    out = subprocess.run([sys.executable, "-m", "dalle_dist", "check", "--cuda-smoke",
                          "--json"], capture_output=True, text=True, timeout=300,
                         check=False)
    try:
        smoke = json.loads(out.stdout)["cuda_smoke"]
    except (json.JSONDecodeError, KeyError):
        return "FAIL", f"exit status {out.returncode}: {out.stderr[-500:]}", {}
    return ("PASS" if smoke["ok"] and out.returncode == 0 else "FAIL", smoke["note"],
            {"exit_status": out.returncode, "cuda_smoke": smoke})
