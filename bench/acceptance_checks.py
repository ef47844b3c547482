"""The in-process checks of bench/gpu_acceptance.py: attention paths, flex recompiles,
sampling. Each returns (status, summary, details); status is "PASS", "FAIL" or
"not run: <why>".
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

Outcome = tuple[str, str, dict[str, Any]]

#: bf16 paths may be this much worse than the dense path in bf16 (both against fp32), plus
#: one bf16 rounding step (2^-7 relative) of slack for a differently ordered sum.
BF16_ERROR_FACTOR, BF16_SLACK = 2.0, 2.0**-7
#: fp32 paths against the fp32 dense reference (TF32 off), relative to the output's scale.
FP32_TOLERANCE = 1e-4
#: A cast model's cached decode logits against its uncached forward: this many roundings
#: of the dtype at the logits' range (tests/model/test_half_sampling.py measured fp16 at
#: 0.35x of it on CPU, bf16 up to 0.5x; a cache missing one position gives 6x-48x), over
#: the first tokens only (each uncached step re-runs the whole sequence).
HALF_ROUNDINGS, HALF_CHECKED_TOKENS = 4, 64


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls without TF32 while inside (the reference must be the reference)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().clamp_min(1e-12)
    return float((got.float() - ref).abs().max() / scale)


# -- attention ------------------------------------------------------------------------------


def attention_sizes(device: torch.device) -> dict[str, int]:
    """One layer over text + image tokens: 1024 image tokens on CUDA, 256 on the CPU
    (sparse needs enough 16-token blocks to leave some out: at 64 it is plain causal)."""
    if device.type == "cuda":
        return {"text_len": 65, "fmap_size": 32, "batch": 2, "heads": 8, "dim_head": 64}
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
    with exact_fp32():
        ref = _layer_run(layer("dense", torch.float32), x, grad_out, layout, True)
        baseline = None
        if dtype is not torch.float32:
            dense = _layer_run(layer("dense", dtype), x.to(dtype), grad_out, layout, True)
            baseline = [_rel_err(a, b) for a, b in zip(dense, ref, strict=True)]
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
            errors = [_rel_err(a, b) if a is not None else None
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


def flex_recompile_check(device: torch.device) -> Outcome:
    """A DALL-E whose layers cycle axial_row, axial_col, conv_like and sparse (8 layers, so
    each pattern twice), FlexAttention on every layer, trained forward + backward at one
    batch size twice and then at another: compiles must stay within the distinct
    (pattern, shape) pairs (4 after the first size, 8 after the second), and dynamo must
    never give up on a frame (its recompile limit silently falls back to eager flex)."""
    if device.type != "cuda":
        return "not run: no CUDA", "", {}
    from dalle_dist.model import DALLE, DALLEConfig

    patterns = ("axial_row", "axial_col", "conv_like", "sparse")
    cfg = DALLEConfig(num_text_tokens=257, text_seq_len=64, num_image_tokens=1024,
                      image_fmap_size=32, dim=256, depth=8, heads=4, dim_head=64,
                      attn_types=patterns)
    torch.manual_seed(0)
    model = DALLE(cfg, "flex").to(device)
    count = flex_compile_counter()
    handler = _Records()
    dynamo_log = logging.getLogger("torch._dynamo")
    dynamo_log.addHandler(handler)
    phases: list[dict[str, Any]] = []
    start = count()
    try:
        for batch in (2, 2, 4):
            text = torch.randint(1, 257, (batch, cfg.text_seq_len), device=device)
            image = torch.randint(0, 1024, (batch, 1024), device=device)
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(text, image)["loss"]
            loss.backward()
            model.zero_grad(set_to_none=True)
            _sync(device)
            phases.append({"batch": batch, "compiles_so_far": count() - start,
                           "seconds": round(time.perf_counter() - t0, 2)})
    finally:
        dynamo_log.removeHandler(handler)
    limit_hits = [m for m in handler.messages if "recompile_limit" in m
                  or "cache_size_limit" in m or "recompilation limit" in m.lower()]
    bounds = [len(patterns), len(patterns), 2 * len(patterns)]
    details = {"phases": phases, "bounds": bounds, "limit_warnings": limit_hits[:3],
               "counter": "attention_paths.flex_compile_stats()['compiles']"}
    over = [p for p, bound in zip(phases, bounds, strict=True) if p["compiles_so_far"] > bound]
    total = phases[-1]["compiles_so_far"]
    if over or limit_hits:
        why = (f"{over[0]['compiles_so_far']} compiles after batch {over[0]['batch']}, "
               f"more than the distinct (pattern, shape) pairs" if over else
               "dynamo hit its recompile limit (flex fell back to eager)")
        return "FAIL", why, details
    return "PASS", f"{total} compiles for {len(patterns)} patterns x 2 shapes", details


# -- sampling ---------------------------------------------------------------------------------


def compiled_sampler(model: Any, device: torch.device, cuda_graphs: bool
                     ) -> tuple[Callable[..., torch.Tensor] | None, str]:
    """`generate --compile`'s sampler over the static KV cache (model/decoding.py):
    torch.compile on the CPU, CUDA graphs (mode "reduce-overhead") on CUDA. Returns a
    function (text, filter_thres, temperature, generator) -> image token ids, with one
    compiled decoder per batch size, as `generate` keeps them."""
    from dalle_dist.model.decoding import StaticDecoder, compile_mode

    if cuda_graphs and compile_mode(device) != "reduce-overhead":
        return None, f"CUDA graphs need CUDA (on {device.type}: {compile_mode(device)})"
    decoders: dict[int, StaticDecoder] = {}

    def sample(text: torch.Tensor, filter_thres: float, temperature: float,
               generator: torch.Generator) -> torch.Tensor:
        batch = text.shape[0]
        if batch not in decoders:
            decoders[batch] = StaticDecoder(model, batch, compiled=True)
        return decoders[batch].sample(text, filter_thres, temperature, generator)

    return sample, ""


def sampling_model(device: torch.device) -> tuple[Any, Any, torch.Tensor]:
    """(DALL-E, VAE, captions): the training check's model size on each device, untrained
    (sampling costs the same whatever the weights say)."""
    from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig

    torch.manual_seed(0)
    if device.type == "cuda":
        vae_cfg = VAEConfig(image_size=128, num_tokens=1024, num_layers=2)
        dims = {"dim": 512, "depth": 8, "heads": 8, "dim_head": 64, "text_seq_len": 64}
    else:
        vae_cfg = VAEConfig(image_size=32, num_tokens=128, num_layers=2)
        dims = {"dim": 64, "depth": 2, "heads": 2, "dim_head": 32, "text_seq_len": 16}
    cfg = DALLEConfig(num_text_tokens=257, num_image_tokens=vae_cfg.num_tokens,
                      image_fmap_size=vae_cfg.fmap_size, **dims)
    model = DALLE(cfg).to(device).eval()
    vae = DiscreteVAE(vae_cfg).to(device).eval()
    text = torch.randint(1, 257, (2, cfg.text_seq_len), generator=torch.Generator().manual_seed(1))
    text[:, cfg.text_seq_len // 2:] = 0
    return model, vae, text.to(device)


def _seconds_per_image(sample: Callable[[torch.Generator], Any], device: torch.device,
                       repeats: int) -> float:
    generator = torch.Generator(device)
    sample(generator.manual_seed(0))  # warm-up: masks, allocator, kernels
    times = []
    for i in range(repeats):
        _sync(device)
        start = time.perf_counter()
        sample(generator.manual_seed(i))
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sampling_static_cache_check(device: torch.device, repeats: int) -> Outcome:
    """Cached sampling (the KV cache) equals uncached sampling token for token, and its
    batch-1 seconds per image (VAE decoding included)."""
    model, vae, text = sampling_model(device)
    with exact_fp32():
        cached = model.sample_image_tokens(text, 0.9, 1.0, torch.Generator(device).manual_seed(3))
        uncached = model.sample_image_tokens(text, 0.9, 1.0,
                                             torch.Generator(device).manual_seed(3),
                                             use_cache=False)
    mismatches = int((cached != uncached).sum())
    seconds = _seconds_per_image(
        lambda g: model.generate_images(text[:1], vae, 0.9, 1.0, g), device, repeats)
    details = {"image_tokens": model.layout.image_len, "seconds_per_image_batch_1":
               round(seconds, 4), "cached_vs_uncached_mismatches": mismatches}
    summary = f"{seconds:.3f} s/image at batch 1 ({model.layout.image_len} tokens)"
    if mismatches:
        return "FAIL", f"cached sampling differs from uncached in {mismatches} tokens", details
    return "PASS", summary + "; cached == uncached", details


def sampling_half_precision_check(device: torch.device, repeats: int) -> Outcome:
    """`generate --precision`: the DALL-E cast to bf16 / fp16 (bf16 only on a GPU that has
    it; fp16 alone on the CPU, where bf16 is emulated) decodes through its cache (that
    dtype on CUDA, fp32 on the CPU: decoding.cache_dtype) with logits equal to the
    uncached forward of the cast model within HALF_ROUNDINGS of its rounding
    (teacher-forced, first HALF_CHECKED_TOKENS tokens); and its batch-1 s/image against
    the fp32 model's."""

    import copy

    from dalle_dist.model.decoding import teacher_forced_logits

    model, vae, text = sampling_model(device)
    dtypes = [torch.float16]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        dtypes.insert(0, torch.bfloat16)
    s_fp32 = _seconds_per_image(
        lambda g: model.generate_images(text[:1], vae, 0.9, 1.0, g), device, repeats)
    details: dict[str, Any] = {"seconds_per_image_fp32": round(s_fp32, 4)}
    failures, parts = [], []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        cast = copy.deepcopy(model).to(dtype)
        tokens = cast.sample_image_tokens(text, 0.9, 1.0, torch.Generator(device).manual_seed(3))
        cached, uncached = teacher_forced_logits(cast, text, tokens[:, :HALF_CHECKED_TOKENS])
        scale = float(uncached.abs().max().clamp_min(1e-12))
        error = float((cached - uncached).abs().max()) / scale
        bound = HALF_ROUNDINGS * torch.finfo(dtype).eps
        seconds = _seconds_per_image(
            lambda g, cast=cast: cast.generate_images(text[:1], vae, 0.9, 1.0, g), device,
            repeats)
        details[name] = {"seconds_per_image": round(seconds, 4),
                         "speedup_vs_fp32": round(s_fp32 / seconds, 2),
                         "cached_vs_uncached_rel_err": round(error, 5), "bound": bound}
        parts.append(f"{name} {seconds:.3f} s/image ({s_fp32 / seconds:.2f}x fp32)")
        if not error <= bound:
            failures.append(f"{name} cached logits off the uncached by {error:.4f} of their "
                            f"range (bound {bound:.4f})")
    if failures:
        return "FAIL", "; ".join(failures), details
    return "PASS", ", ".join(parts) + "; cached == uncached within rounding", details


def sampling_cuda_graphs_check(device: torch.device, repeats: int) -> Outcome:
    """The compiled decode step (CUDA graphs) samples the same tokens as eager, faster."""
    if device.type != "cuda":
        return "not run: no CUDA", "", {}
    model, _, text = sampling_model(device)
    sampler, why = compiled_sampler(model, device, cuda_graphs=True)
    if sampler is None:
        return f"not run: {why}", "", {}
    eager = model.sample_image_tokens(text, 0.9, 1.0, torch.Generator(device).manual_seed(3))
    graphed = sampler(text, 0.9, 1.0, torch.Generator(device).manual_seed(3))
    mismatches = int((eager != graphed).sum())
    s_eager = _seconds_per_image(
        lambda g: model.sample_image_tokens(text[:1], 0.9, 1.0, g), device, repeats)
    s_graphs = _seconds_per_image(lambda g: sampler(text[:1], 0.9, 1.0, g), device, repeats)
    details = {"seconds_per_image_eager": round(s_eager, 4),
               "seconds_per_image_cuda_graphs": round(s_graphs, 4),
               "speedup": round(s_eager / s_graphs, 2), "mismatches": mismatches}
    if mismatches:
        return "FAIL", f"CUDA-graph sampling differs from eager in {mismatches} tokens", details
    return "PASS", (f"{s_graphs:.3f} s/image with CUDA graphs, {s_eager:.3f} eager "
                    f"({s_eager / s_graphs:.1f}x)"), details
