"""The sampling checks of `dalle-dist selftest`: the KV cache, half-precision decoding
and CUDA graphs each sample what plain decoding samples, and how fast.

Sampling is where a fast path can be silently wrong (a cache one position short still
draws plausible tokens), so each fast path's logits, at the tokens it sampled, are held
to the uncached forward's on the same tokens within its dtype's rounding
(`logits_tolerance`). Tokens are not compared for equality: two correct kernels round
differently, and one near tie in the Gumbel argmax then changes every later token; the
share of steps where both logits draw the same token is reported. The model is the
training check's size, untrained: sampling costs the same whatever the weights say.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dalle_dist.model.decoding import StaticDecoder
from dalle_dist.model.modes import eval_mode
from dalle_dist.model.sampling import sample_tokens
from dalle_dist.model.vqgan import exact_fp32_matmuls
from dalle_dist.selftest.checks import sync
from dalle_dist.selftest.report import NO_CUDA, Outcome

#: Top-k threshold, temperature and seed of every sampling check.
FILTER_THRES, TEMPERATURE, SEED = 0.9, 1.0, 3
#: Image steps whose logits are checked against the uncached forward, spread evenly over
#: the image, last included (each costs a forward over the whole sequence so far; a cache
#: error stays in the cache and shows at every later step).
CHECKED_STEPS = 64

# The tolerance of a fast path's logits against the uncached forward of the same model on
# the same tokens, as the relative RMS difference ||fast - uncached|| / ||uncached||, in
# units of the dtype's eps:
# - Rounding to the dtype errs by up to eps/2 of the value, uniformly: variance eps^2/12.
#   The decode step (one query row, over the cache) and the full forward (every row) run
#   different kernels, so at worst they round each tensor independently: eps^2/6 of
#   difference per rounding.
# - Per layer, ROUNDED_PER_LAYER tensors are materialised in the dtype. With a half-precision
#   KV cache (CUDA) the keys and values a step attends over were rounded at the steps that
#   wrote them, with every lower layer's differences in them: all `depth` layers' roundings
#   reach each later step's logits.
# - Sums: bf16 / fp16 matmuls accumulate in fp32, but cuBLAS may add split-K partials in
#   the dtype (torch allows reduced-precision reductions by default): SPLIT_K_ROUNDINGS more
#   for each of the layer's LINEARS_PER_LAYER. fp32 accumulates in fp32 itself: a K-term
#   sum added term after term (a GEMM's accumulator register) rounds partial sums of size
#   ~sqrt(k), relative variance (eps^2/12) x K/2 against the sum's own: K/2 roundings for
#   each of the layer's SUMS_PER_LAYER, K the widest (dim x ff_mult or the sequence).
# - The head (final LayerNorm, logits matmul) counts the same way.
# - A relative difference passes through a layer with gain <= 1 (pre-norm: LayerNorm takes
#   out the stream's scale; untrained weights keep attention near uniform and the branches
#   below the residual stream) and independent differences add in variance:
#   rms <= eps x sqrt(n / 6), n = depth x roundings per layer + the head's. The bound is
#   MARGIN times that: room for a gain above 1, or for four times the roundings counted.
#   (All roundings aligned, n x eps, would exceed the logits themselves in bf16 at depth
#   8: no bound at all.)
# The selftest's GPU model (depth 8, widest sum 2048): half n = 8 x 24 + 5 = 197, bound
# 11.5 eps = 0.090 bf16, 0.0112 fp16; fp32 n = 8 x 8204 + 2050 = 67682, bound 212 eps =
# 2.5e-5. Measured on the CPU at that size: fp32 8.3 eps, and 6e4 and more with one
# forgotten cache step or one corrupted cached key. Such a one-position bug moves bf16
# logits less than their rounding; the fp32 checks run the same cache code and catch it.
# (tests/test_selftest_sampling.py: the bugs on a tiny model.)
ROUNDED_PER_LAYER = 12  # attn_norm, q/k/v, softmax, attention, to_out, residual, ff_norm,
#                         value/gate, GELU, product, proj_out, residual
SUMS_PER_LAYER = 8  # 2 LayerNorms; q/k/v, scores, weights x values, to_out, value/gate, proj_out
LINEARS_PER_LAYER = 4  # q/k/v, to_out, value/gate, proj_out
SPLIT_K_ROUNDINGS = 3  # up to 4 split-K partials added in the dtype
HEAD_ROUNDED, HEAD_SUMS = 2, 2  # the final LayerNorm and the logits' matmul
MARGIN = 2.0


def logits_tolerance(model: Any, dtype: torch.dtype) -> float:
    """The largest relative RMS difference between a correct fast path's logits and the
    uncached forward's, for `model` computing in `dtype` (the derivation above)."""
    config = model.config
    if dtype == torch.float32:
        per_sum = max(config.dim * config.ff_mult, model.layout.seq_len) // 2
        per_layer = ROUNDED_PER_LAYER + SUMS_PER_LAYER * per_sum
        head = HEAD_ROUNDED + HEAD_SUMS * per_sum
    else:
        per_layer = ROUNDED_PER_LAYER + LINEARS_PER_LAYER * SPLIT_K_ROUNDINGS
        head = HEAD_ROUNDED + SPLIT_K_ROUNDINGS
    roundings = config.depth * per_layer + head
    return MARGIN * torch.finfo(dtype).eps * math.sqrt(roundings / 6)


class RecordingDecoder(StaticDecoder):
    """A StaticDecoder that keeps the logits each of its tokens was drawn from: the fast
    path's own, compiled and CUDA-graph steps included (copied: a graph's output buffer is
    overwritten by its next replay)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[torch.Tensor] = []

    def next_logits(self, logits: torch.Tensor) -> torch.Tensor:
        out = super().next_logits(logits)
        self.seen.append(out.detach().to(torch.float32, copy=True))
        return out


@dataclass(frozen=True)
class Agreement:
    """A fast path's logits against the uncached forward's, at the checked steps."""

    rel_err: float  # ||fast - uncached|| / ||uncached||
    max_rel_err: float  # max |fast - uncached| / max |uncached|
    bound: float  # logits_tolerance
    same_tokens: float  # share of (step, row) where the uncached logits draw the same token
    steps: int

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.bound  # NaN fails

    def details(self) -> dict[str, Any]:
        return {"cached_vs_uncached_rel_err": self.rel_err,
                "cached_vs_uncached_max_rel_err": self.max_rel_err, "bound": self.bound,
                "same_tokens": self.same_tokens, "checked_steps": self.steps}

    def failure(self, path: str) -> str:
        return (f"{path} logits off the uncached forward's by {self.rel_err:.3g} (relative "
                f"RMS; bound {self.bound:.3g})")


@torch.no_grad()
def fast_path_agreement(decoder: RecordingDecoder, text: torch.Tensor) -> Agreement:
    """Sample with `decoder`, then compare the logits each token was drawn from with the
    uncached forward of its model on the sampled tokens, at CHECKED_STEPS steps, against
    logits_tolerance in the dtype of the model's weights; and redraw each checked token
    from the uncached logits with the same noise (the generator replayed) to count the
    tokens both draw."""
    model, device = decoder.model, text.device
    decoder.seen.clear()
    tokens = decoder.sample(text, FILTER_THRES, TEMPERATURE,
                            torch.Generator(device).manual_seed(SEED))
    n = tokens.shape[1]
    checked = set(torch.linspace(0, n - 1, min(CHECKED_STEPS, n)).round().long().tolist())
    replay = torch.Generator(device).manual_seed(SEED)
    fast, uncached, same = [], [], 0
    with eval_mode(model):
        for j in range(n):
            if j not in checked:  # draw what the fast path drew, to keep the noise aligned
                sample_tokens(decoder.seen[j], FILTER_THRES, TEMPERATURE, replay)
                continue
            ref = model.uncached_image_logits(text, tokens[:, :j]).float()
            drawn = sample_tokens(ref, FILTER_THRES, TEMPERATURE, replay)
            same += int((drawn == tokens[:, j]).sum())
            fast.append(decoder.seen[j])
            uncached.append(ref)
    got, ref = torch.stack(fast), torch.stack(uncached)
    tiny = torch.finfo(torch.float32).tiny
    return Agreement(
        rel_err=float((got - ref).norm() / ref.norm().clamp_min(tiny)),
        max_rel_err=float((got - ref).abs().max() / ref.abs().max().clamp_min(tiny)),
        bound=logits_tolerance(model, model.text_emb.weight.dtype),
        same_tokens=same / (len(checked) * text.shape[0]), steps=len(checked))


def compiled_sampler(model: Any, device: torch.device, cuda_graphs: bool
                     ) -> tuple[Callable[..., torch.Tensor] | None, str]:
    """`generate --compile`'s sampler over the static KV cache (model/decoding.py):
    torch.compile on the CPU, CUDA graphs (mode "reduce-overhead") on CUDA. Returns a
    function (text, filter_thres, temperature, generator) -> image token ids, with one
    compiled decoder per batch size, as `generate` keeps them."""
    from dalle_dist.model.decoding import compile_mode

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
                       repeats: int, warmup: bool = True) -> float:
    """The median of `repeats` timed samples, after one untimed one when `warmup` (masks,
    allocator, kernels; a compiled sampler's compile). An eager path whose agreement run
    has just warmed the same model may skip it: one image is seconds on a GPU."""
    generator = torch.Generator(device)
    if warmup:
        sample(generator.manual_seed(0))
    times = []
    for i in range(repeats):
        sync(device)
        start = time.perf_counter()
        sample(generator.manual_seed(i))
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sampling_static_cache_check(device: torch.device, repeats: int,
                                models: tuple[Any, Any, torch.Tensor] | None = None) -> Outcome:
    """Cached sampling's logits (the KV cache, fp32) equal the uncached forward's within
    logits_tolerance, and its batch-1 seconds per image (VAE decoding included).
    `models`: (DALL-E, VAE, captions), sampling_model's by default."""
    model, vae, text = models or sampling_model(device)
    with exact_fp32_matmuls():
        agreement = fast_path_agreement(RecordingDecoder(model, text.shape[0]), text)
    seconds = _seconds_per_image(
        lambda g: model.generate_images(text[:1], vae, FILTER_THRES, TEMPERATURE, g), device,
        repeats, warmup=repeats > 1)
    details = {"image_tokens": model.layout.image_len, "seconds_per_image_batch_1":
               round(seconds, 4), **agreement.details()}
    summary = f"{seconds:.3f} s/image at batch 1 ({model.layout.image_len} tokens)"
    if not agreement.ok:
        return "FAIL", agreement.failure("cached"), details
    return "PASS", (f"{summary}; cached == uncached within rounding "
                    f"({agreement.same_tokens:.1%} same tokens)"), details


def sampling_half_precision_check(device: torch.device, repeats: int,
                                  models: tuple[Any, Any, torch.Tensor] | None = None,
                                  fp32_seconds: float | None = None) -> Outcome:
    """`generate --precision`: the DALL-E cast to bf16 / fp16 (bf16 only on a GPU that has
    it; fp16 alone on the CPU, where bf16 is emulated) decodes through its cache (that
    dtype on CUDA, fp32 on the CPU: decoding.cache_dtype) with logits equal to the
    uncached forward of the cast model within logits_tolerance; and its batch-1 s/image
    against the fp32 model's. `models`: as sampling_static_cache_check's;
    `fp32_seconds`: the fp32 model's s/image as that check measured it (else timed here)."""
    model, vae, text = models or sampling_model(device)
    dtypes = [torch.float16]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        dtypes.insert(0, torch.bfloat16)
    s_fp32 = fp32_seconds or _seconds_per_image(
        lambda g: model.generate_images(text[:1], vae, FILTER_THRES, TEMPERATURE, g), device,
        repeats)
    details: dict[str, Any] = {"seconds_per_image_fp32": round(s_fp32, 4)}
    failures, parts = [], []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        cast = copy.deepcopy(model).to(dtype)
        decoder = RecordingDecoder(cast, text.shape[0])
        agreement = fast_path_agreement(decoder, text)
        seconds = _seconds_per_image(
            lambda g, cast=cast: cast.generate_images(text[:1], vae, FILTER_THRES, TEMPERATURE,
                                                      g), device, repeats, warmup=repeats > 1)
        details[name] = {"seconds_per_image": round(seconds, 4),
                         "speedup_vs_fp32": round(s_fp32 / seconds, 2),
                         "cache_dtype": str(decoder.caches[0].k.dtype).removeprefix("torch."),
                         **agreement.details()}
        parts.append(f"{name} {seconds:.3f} s/image ({s_fp32 / seconds:.2f}x fp32, "
                     f"{agreement.same_tokens:.1%} same tokens)")
        if not agreement.ok:
            failures.append(agreement.failure(f"{name} cached"))
    if failures:
        return "FAIL", "; ".join(failures), details
    return "PASS", ", ".join(parts) + "; cached == uncached within rounding", details


def sampling_cuda_graphs_check(device: torch.device, repeats: int) -> Outcome:
    """The compiled decode step (CUDA graphs): its logits equal the uncached forward's
    within logits_tolerance (fp32), and it samples faster than eager."""
    if device.type != "cuda":
        return NO_CUDA, "", {}
    model, _, text = sampling_model(device)
    sampler, why = compiled_sampler(model, device, cuda_graphs=True)
    if sampler is None:
        return f"not run: {why}", "", {}
    with exact_fp32_matmuls():
        agreement = fast_path_agreement(
            RecordingDecoder(model, text.shape[0], compiled=True), text)
    s_eager = _seconds_per_image(
        lambda g: model.sample_image_tokens(text[:1], FILTER_THRES, TEMPERATURE, g), device,
        repeats, warmup=repeats > 1)
    s_graphs = _seconds_per_image(lambda g: sampler(text[:1], FILTER_THRES, TEMPERATURE, g),
                                  device, repeats)
    details = {"seconds_per_image_eager": round(s_eager, 4),
               "seconds_per_image_cuda_graphs": round(s_graphs, 4),
               "speedup": round(s_eager / s_graphs, 2), **agreement.details()}
    if not agreement.ok:
        return "FAIL", agreement.failure("CUDA-graph"), details
    return "PASS", (f"{s_graphs:.3f} s/image with CUDA graphs, {s_eager:.3f} eager "
                    f"({s_eager / s_graphs:.1f}x); logits == uncached within rounding "
                    f"({agreement.same_tokens:.1%} same tokens)"), details
