"""The sampling checks of `dalle-dist selftest`: the KV cache, half-precision decoding
and CUDA graphs each sample what plain decoding samples, and how fast.

Sampling is where a fast path can be silently wrong (a cache one position short still
draws plausible tokens), so each fast path is held to the slow one token for token, or,
in half precision, logit for logit within the dtype's rounding. The model is the training
check's size, untrained: sampling costs the same whatever the weights say.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from dalle_dist.selftest.checks import exact_fp32, sync
from dalle_dist.selftest.report import NO_CUDA, Outcome

#: A cast model's cached decode logits against its uncached forward: this many roundings
#: of the dtype at the logits' range (tests/model/test_half_sampling.py measured fp16 at
#: 0.35x of it on CPU, bf16 up to 0.5x; a cache missing one position gives 6x-48x), over
#: the first tokens only (each uncached step re-runs the whole sequence).
HALF_ROUNDINGS, HALF_CHECKED_TOKENS = 4, 64



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
        sync(device)
        start = time.perf_counter()
        sample(generator.manual_seed(i))
        sync(device)
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
        return NO_CUDA, "", {}
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
