"""DALLE-pytorch 1.6.6's training step and ours, timed in turns in one process, as JSON.

Each round takes one step of theirs, one of ours and one matmul-peak probe, starting one
place further along each round (as bench/generate_side_by_side.py does for sampling), so
a drift of this VM's speed weighs on both sides alike; the ratios are of the medians over
the rounds, by wall time and by the process's CPU time. Run it with the interpreter that
has dalle-pytorch (bench/generate_reference.py says how to make one) and our sources on
the path:

    .venv/bin/python bench/train_side_by_side.py [--rotary_shift [on|off|both]]
    .venv/bin/python bench/train_side_by_side.py \
        --patterns full,axial_row --image_tokens 1024
    .venv/bin/python bench/train_side_by_side.py --profile 12   # where the time goes

With --profile K, each pair also gets 3 profiled steps per side (torch.profiler's self
CPU time per aten op): the K ops where each side spends most, the K largest differences,
and a ceiling: the ratio and MFU ours would reach if nothing but its matrix products
(mm, addmm, bmm, SDPA's kernels) took time.

A step, on either side, is the model-level step of its training script (no data loading,
no VAE: both take image token ids): forward, backward, clip_grad_norm_ 0.5, Adam step,
zero_grad. Theirs as its train_dalle.py builds it (DALLE(...) with rotary_emb and
shift_tokens off unless --rotary_shift, torch.optim.Adam over the trainable parameters;
`--rotary_shift both` times every pair both ways, each result saying which);
ours DALLE(DALLEConfig) with make_adam (fused Adam), as our train loop steps (with
--compile, its blocks compiled as `train --compile` does). fp32, dim 256,
depth 4, 4 heads x 64, text 32 of 1000 tokens, 512 image codes; batch 8 at 256 image tokens
(fmap 16), 2 at 1024 (fmap 32).

Before timing, each pair must be the same model, or the script exits 2 with one line:
  parameters  theirs' trainable count less its LayerScale vectors (1.6.6 scales every
              attention and feed-forward output by a learned per-channel vector, 2 x depth
              x dim numbers; ours has none) must equal ours exactly;
  FLOPs       one forward each under torch.utils.flop_counter. The weight matmuls
              (aten.mm/addmm: projections, feed-forward, logits) must agree within 1% once
              theirs' full-vocabulary logits are taken off (1.6.6 projects every position
              onto text + image vocabularies and masks half; ours projects each position
              onto its own). The attention core (QK^T, AV: bmm, SDPA) is reported, not
              compared: it is how each side computes the pattern (theirs' conv_like unfolds
              a k x k window; ours masks it out of a band of rows, or below a 24 x 24
              grid out of the whole sequence).
MFU holds both sides to one number of model FLOPs, 3 x a forward's (backward costs twice
the forward): the matched weight matmuls plus the smaller of the two attention cores, the
pattern's work as the leaner side computes it. For full attention that is exactly
dalle_dist.selftest.mfu's formula (bench/train_step.py, `dalle-dist selftest`), which
counts attention as dense for every pattern and so would put the axial patterns above 1;
it is reported as formula_flops_per_step. The peak is the best fp32 matmul (bench/common.py)
timed in the same rounds. counted_utilisation uses each side's own counted forward x 3.

Both sides share the process's allocator and threads. Under glibc's defaults a tensor over
malloc's mmap threshold (which adapts, up to 32 MB) is mapped afresh at each allocation and
its pages faulted in: DALLE-pytorch's score tensors at 1024 tokens are such tensors (about
280,000 minor faults a step at `full`), ours are not (0 or 1), so fixing the thresholds
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) speeds theirs and lowers the ratios, as
another allocator preloaded (LD_PRELOAD) may; the JSON's `machine` records those variables
and the CPU (docs/benchmarks.md has the figures both ways). This process keeps glibc's
defaults for both, as a user of theirs runs it. In it our step faults nothing: the heap that
their large blocks leave behind serves ours. In a process of its own it did (18,000 to
29,000 faults a step), until `train` kept its heap on CPU (train/cpu_settings.py, which
bench/train_step.py applies too), so the figures here are ours as `train` now runs.

Pattern `sparse` is DALLE-pytorch's DeepSpeed sparse attention: its kernel is Triton on
CUDA, so on a CPU it is recorded as skipped, with the reason, and axial_col runs in its
place.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    add_model_size_args,
    comma_list,
    compile_fresh,
    emit,
    matmul_peak_flops,
    positive_ints,
    require_positive,
    set_threads,
    square_tokens,
)
from generate_reference import stub_unused_imports

from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.patterns import PATTERNS
from dalle_dist.selftest.mfu import training_flops_per_step
from dalle_dist.selftest.step_profile import own_times
from dalle_dist.train.flops import cpu_attention_formulas
from dalle_dist.train.optim import make_adam

#: batch per image-token count (the issue's: 8 at 256 tokens, 2 at 1024)
DEFAULT_BATCH = {256: 8, 1024: 2}
#: 2-layer VAE: image side = fmap x 4
VAE_LAYERS = 2
LEARNING_RATE = 3e-4  # train_dalle.py's default, and ours
CLIP_NORM = 0.5  # train_dalle.py's GRAD_CLIP_NORM, and our --clip_grad_norm default
FLOP_TOLERANCE = 0.01
WEIGHT_MATMULS = ("aten.mm", "aten.addmm")
#: --rotary_shift's values: the settings each runs, in order
ROTARY_SHIFT = {"off": (False,), "on": (True,), "both": (False, True)}


class ModelMismatch(Exception):
    """The two models differ in a way this bench refuses to time."""


@dataclass
class Side:
    """One contender: its model, one training step, and its counted numbers."""

    model: nn.Module
    step: Callable[[], None]
    flops: dict[str, int]


def their_side(args: argparse.Namespace, pattern: str, fmap: int, rotary_shift: bool,
               text: torch.Tensor, image: torch.Tensor) -> Side:
    """1.6.6's DALLE as its train_dalle.py builds it, and that script's step."""
    stub_unused_imports()
    from dalle_pytorch import DALLE as TheirDALLE
    from dalle_pytorch import DiscreteVAE

    torch.manual_seed(0)
    vae = DiscreteVAE(image_size=fmap * 2**VAE_LAYERS, num_layers=VAE_LAYERS,
                      num_tokens=args.num_image_tokens)
    model = TheirDALLE(dim=args.dim, vae=vae, num_text_tokens=args.num_text_tokens,
                       text_seq_len=args.text_seq_len, depth=args.depth, heads=args.heads,
                       dim_head=args.dim_head, reversible=False, loss_img_weight=7,
                       attn_types=(pattern,), ff_dropout=0.0, attn_dropout=0.0, stable=False,
                       shift_tokens=rotary_shift, rotary_emb=rotary_shift,
                       shared_attn_ids=None, shared_ff_ids=None,
                       share_input_output_emb=False).train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                                 lr=LEARNING_RATE)

    def forward() -> torch.Tensor:
        return model(text, image, return_loss=True)

    def step() -> None:
        loss = forward()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad()

    return Side(model, step, count_forward(forward))


def our_side(args: argparse.Namespace, pattern: str, fmap: int, rotary_shift: bool,
             text: torch.Tensor, image: torch.Tensor) -> Side:
    """Our DALLE on the same config, stepped as train/loop.py steps it (engine.backward,
    clip_and_step, zero_grad(set_to_none=True) over make_adam)."""
    torch.manual_seed(0)
    model = DALLE(our_config(args, pattern, fmap, rotary_shift)).train()
    optimizer = make_adam(model.parameters(), lr=LEARNING_RATE)

    def forward() -> torch.Tensor:
        return model(text, image)["loss"]

    def step() -> None:
        loss = forward()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    flops = count_forward(forward)  # eagerly: a FLOP counter cannot run a compiled graph
    if args.compile:
        compile_fresh(model.transformer)
    return Side(model, step, flops)


def our_config(args: argparse.Namespace, pattern: str, fmap: int,
               rotary_shift: bool) -> DALLEConfig:
    return DALLEConfig(num_text_tokens=args.num_text_tokens, text_seq_len=args.text_seq_len,
                       num_image_tokens=args.num_image_tokens, image_fmap_size=fmap,
                       dim=args.dim, depth=args.depth, heads=args.heads,
                       dim_head=args.dim_head, attn_types=(pattern,),
                       rotary_emb=rotary_shift, shift_tokens=rotary_shift)


def count_forward(forward: Callable[[], torch.Tensor]) -> dict[str, int]:
    """FLOPs of one forward: the weight matmuls apart from the rest (the attention core).
    CPU SDPA is counted with the CUDA kernels' formula (train/flops.py), or it reads 0."""
    with FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas()) as counter:
        forward()
    by_op = counter.get_flop_counts().get("Global", {})
    weights = sum(n for op, n in by_op.items() if str(op) in WEIGHT_MATMULS)
    total = sum(by_op.values())
    return {"total": total, "weight_matmuls": weights, "attention_core": total - weights}


def full_vocab_excess(args: argparse.Namespace, image_len: int, batch: int) -> int:
    """Forward FLOPs 1.6.6 spends projecting each position onto the other vocabulary too:
    text_seq_len positions x image codes, image_len positions x text vocabulary (its text
    vocabulary has text_seq_len padding ids added, as ours)."""
    text_vocab = args.num_text_tokens + args.text_seq_len
    return 2 * batch * args.dim * (args.text_seq_len * args.num_image_tokens
                                   + image_len * text_vocab)


def layerscale_parameters(model: nn.Module) -> int:
    """1.6.6's LayerScale vectors (one per attention and feed-forward branch)."""
    return sum(m.scale.numel() for m in model.modules() if type(m).__name__ == "LayerScale")


def check_equal(args: argparse.Namespace, theirs: Side, ours: Side, label: str,
                image_len: int, batch: int) -> dict[str, Any]:
    """Parameter and FLOP equality (module docstring); raises ModelMismatch."""
    their_params = sum(p.numel() for p in theirs.model.parameters() if p.requires_grad)
    layerscale = layerscale_parameters(theirs.model)
    our_params = sum(p.numel() for p in ours.model.parameters())
    if their_params - layerscale != our_params:
        raise ModelMismatch(
            f"{label}: parameters differ: DALLE-pytorch {their_params} trainable less "
            f"{layerscale} LayerScale = {their_params - layerscale}, ours {our_params}")
    excess = full_vocab_excess(args, image_len, batch)
    their_matched = theirs.flops["weight_matmuls"] - excess
    ours_weights = ours.flops["weight_matmuls"]
    off = abs(their_matched - ours_weights) / ours_weights
    if off > FLOP_TOLERANCE:
        raise ModelMismatch(
            f"{label}: forward weight-matmul FLOPs differ by {100 * off:.2f}%: DALLE-pytorch "
            f"{theirs.flops['weight_matmuls']} less {excess} full-vocabulary logits = "
            f"{their_matched}, ours {ours_weights}")
    return {
        "parameters": {"dalle_pytorch_trainable": their_params,
                       "dalle_pytorch_layerscale": layerscale,
                       "dalle_pytorch_matched": their_params - layerscale,
                       "ours": our_params},
        "forward_flops": {"dalle_pytorch": theirs.flops, "ours": ours.flops,
                          "dalle_pytorch_full_vocab_logits": excess,
                          "weight_matmuls_matched_off": round(off, 5),
                          "total_matched_off": round(
                              (theirs.flops["total"] - excess) / ours.flops["total"] - 1, 5),
                          "attention_core_ratio": round(
                              theirs.flops["attention_core"]
                              / max(ours.flops["attention_core"], 1), 3)},
    }


def sparse_skip_reason() -> str:
    """Why 1.6.6's `sparse` cannot run here: DeepSpeed's sparse attention is a Triton
    kernel for CUDA, and recent DeepSpeed has dropped it altogether. Looked up without
    importing DeepSpeed, whose import logs to stdout (this script's JSON)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return "needs DeepSpeed's sparse attention; deepspeed is not installed"
    if not (Path(spec.origin).parent / "ops" / "sparse_attention").is_dir():
        return (f"needs deepspeed.ops.sparse_attention, which DeepSpeed "
                f"{importlib.metadata.version('deepspeed')} does not have")
    return "DeepSpeed's sparse attention is a Triton kernel for CUDA; this bench runs on CPU"


def time_pair(theirs: Side, ours: Side, rounds: int, warmup: int
              ) -> tuple[dict[str, list[float]], dict[str, list[float]], float]:
    """Wall and CPU seconds per step for each side over `rounds` rotated rounds, and the
    best matmul FLOP/s of a probe run in the same rotation."""
    peak = [0.0]

    def probe() -> None:
        peak[0] = max(peak[0], matmul_peak_flops(repeats=2))

    runs = {"dalle_pytorch": theirs.step, "ours": ours.step, "matmul_peak": probe}
    for _ in range(warmup):
        for run in runs.values():
            run()
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for round_ in range(rounds):
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            start, start_cpu = time.perf_counter(), time.process_time()
            runs[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu, peak[0]


def op_times(step: Callable[[], None], steps: int = 3) -> dict[str, float]:
    """Self CPU milliseconds per op in a step, from torch.profiler (the op's own time, its
    callees' apart, so the entries add up to the step): each op's median over `steps`
    profiled steps, as one step's reading moves by a tenth on this VM."""
    from torch.profiler import ProfilerActivity, profile

    readings: list[dict[str, float]] = []
    for _ in range(steps):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        readings.append(own_times(prof.key_averages(), device=False))
    names = set().union(*readings)
    return {name: statistics.median(r.get(name, 0.0) for r in readings) for name in names}


#: the ops that do a step's matrix products: the weight matmuls, the attention's batched
#: matmuls and SDPA's CPU kernels
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm",
              "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def profile_pair(theirs: Side, ours: Side, top: int, model_flops: float,
                 peak: float) -> dict[str, Any]:
    """Profiled steps of each side (after the timed rounds, so both are warm): the
    ops where the two spend most, and where they differ most (issue 25 item 2).

    `ceiling` bounds what any change outside the matrix products can gain: the ratio and
    MFU our side would reach if every other op took no time (its matmul ops' self time
    as they run now, their step's whole self time). A target above them needs faster
    matrix products, not less overhead."""
    their_ms, our_ms = op_times(theirs.step), op_times(ours.step)
    names = set(their_ms) | set(our_ms)
    rows = sorted(((name, round(their_ms.get(name, 0.0), 2), round(our_ms.get(name, 0.0), 2))
                   for name in names), key=lambda row: -abs(row[1] - row[2]))
    our_matmul_ms = sum(our_ms.get(name, 0.0) for name in MATMUL_OPS)
    return {
        "total_self_ms": {"dalle_pytorch": round(sum(their_ms.values()), 1),
                          "ours": round(sum(our_ms.values()), 1)},
        "ours_matmul_ops_ms": round(our_matmul_ms, 1),
        "ceiling": {"ratio": round(sum(their_ms.values()) / our_matmul_ms, 3),
                    "mfu": round(model_flops / peak / (our_matmul_ms / 1e3), 4)},
        "top_ours": [[n, round(t, 2)] for n, t in
                     sorted(our_ms.items(), key=lambda kv: -kv[1])[:top]],
        "top_dalle_pytorch": [[n, round(t, 2)] for n, t in
                              sorted(their_ms.items(), key=lambda kv: -kv[1])[:top]],
        "largest_differences_ms": [{"op": n, "dalle_pytorch": a, "ours": b}
                                   for n, a, b in rows[:top]],
    }


def compare(args: argparse.Namespace, pattern: str, image_len: int,
            rotary_shift: bool) -> dict[str, Any]:
    fmap = math.isqrt(image_len)  # a power of two (main checked it)
    batch = args.batch or DEFAULT_BATCH.get(image_len, 2)
    generator = torch.Generator().manual_seed(0)
    text = torch.randint(1, args.num_text_tokens, (batch, args.text_seq_len),
                         generator=generator)
    text[:, args.text_seq_len // 2:] = 0  # half padding, like real captions
    image = torch.randint(0, args.num_image_tokens, (batch, image_len), generator=generator)
    label = (f"{pattern} at {image_len} image tokens"
             + (" with rotary + shift" if rotary_shift else ""))
    theirs = their_side(args, pattern, fmap, rotary_shift, text, image)
    ours = our_side(args, pattern, fmap, rotary_shift, text, image)
    equality = check_equal(args, theirs, ours, label, image_len, batch)
    wall, cpu, peak = time_pair(theirs, ours, args.rounds, args.warmup)
    model_flops = 3 * (ours.flops["weight_matmuls"]
                       + min(theirs.flops["attention_core"], ours.flops["attention_core"]))
    sides = {}
    for name, side in (("dalle_pytorch", theirs), ("ours", ours)):
        step_s = statistics.median(wall[name])
        sides[name] = {"median_step_s": round(step_s, 4),
                       "median_cpu_s": round(statistics.median(cpu[name]), 4),
                       "spread_s": [round(min(wall[name]), 4), round(max(wall[name]), 4)],
                       "samples_per_s": round(batch / step_s, 2),
                       "mfu": round(model_flops / step_s / peak, 4),
                       "counted_utilisation": round(
                           3 * side.flops["total"] / step_s / peak, 4)}
    profiled = ({"profile": profile_pair(theirs, ours, args.profile, model_flops, peak)}
                if args.profile else {})
    ratio_wall = statistics.median(wall["dalle_pytorch"]) / statistics.median(wall["ours"])
    ratio_cpu = statistics.median(cpu["dalle_pytorch"]) / statistics.median(cpu["ours"])
    return {"pattern": pattern, "image_tokens": image_len, "rotary_shift": rotary_shift,
            "batch": batch, **sides,
            "ratio_wall": round(ratio_wall, 3), "ratio_cpu": round(ratio_cpu, 3),
            "matmul_peak_gflops": round(peak / 1e9, 1),
            "model_flops_per_step": model_flops,
            "formula_flops_per_step": training_flops_per_step(
                our_config(args, pattern, fmap, rotary_shift), batch), **equality,
            **profiled}


def versions() -> dict[str, str]:
    found = {"torch": torch.__version__}
    for name in ("dalle-pytorch", "dalle_dist", "rotary-embedding-torch",
                 "axial_positional_embedding", "einops"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def checked_lists(parser: argparse.ArgumentParser, args: argparse.Namespace
                  ) -> tuple[list[str], list[int]]:
    """The patterns and image-token counts, every flag checked before a model is built: a
    bad one is argparse's usage error (exit 2), not DALLE-pytorch's assertion minutes into
    a run."""
    require_positive(parser, args, "rounds", "threads", "batch", "dim", "depth", "heads",
                     "dim_head", "text_seq_len", "num_text_tokens", "num_image_tokens")
    if args.warmup < 0:
        parser.error(f"--warmup must be at least 0, not {args.warmup}")
    patterns = comma_list(parser, "--patterns", args.patterns, PATTERNS)
    comma_list(parser, "--image_tokens", args.image_tokens)  # an empty entry, said as such
    image_lens = positive_ints(parser, "--image_tokens", args.image_tokens)
    for image_len in image_lens:
        side = math.isqrt(square_tokens(parser, "--image_tokens", image_len))
        if side & (side - 1):
            parser.error(f"--image_tokens {image_len}: DALLE-pytorch's VAE needs a grid "
                         "side that is a power of two (e.g. 64, 256, 1024 tokens)")
    return patterns, image_lens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patterns", default="full,axial_row,conv_like,sparse",
                        help="comma list; sparse is skipped on a CPU and axial_col runs "
                             "instead")
    parser.add_argument("--image_tokens", default="256,1024",
                        help="comma list of image token counts (squares)")
    parser.add_argument("--rotary_shift", nargs="?", const="on", default="off",
                        choices=tuple(ROTARY_SHIFT),
                        help="rotary embeddings and shifted tokens on both sides: off "
                             "(the default, as 1.6.6's train_dalle.py builds it), on (the "
                             "flag alone), or both (every pair timed each way)")
    parser.add_argument("--compile", action="store_true",
                        help="our side's blocks compiled (train --compile: inductor, per "
                             "block; the compile runs in the warm-up steps, 2 at least)")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="also profile 3 steps of each side (torch.profiler, each op's "
                             "median self CPU time) and report the K ops where each spends "
                             "most, the K largest differences and the matmul-only ceiling")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None,
                        help="one batch for every length (default: 8 at 256 tokens, 2 at "
                             "1024)")
    add_model_size_args(parser)
    parser.add_argument("--num_image_tokens", type=int, default=512)
    args = parser.parse_args()
    patterns, image_lens = checked_lists(parser, args)
    if args.compile:
        args.warmup = max(args.warmup, 2)
    set_threads(args.threads)
    skipped = {}
    if "sparse" in patterns:
        skipped["sparse"] = sparse_skip_reason() + "; axial_col runs in its place"
        patterns = [p for p in patterns if p != "sparse"]
        if "axial_col" not in patterns:
            patterns.append("axial_col")
    results = []
    try:
        for rotary_shift in ROTARY_SHIFT[args.rotary_shift]:
            for image_len in image_lens:
                for pattern in patterns:
                    results.append(compare(args, pattern, image_len, rotary_shift))
                    gc.collect()
    except ModelMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    emit({"bench": "train_side_by_side", "versions": versions(),
          "settings": {**vars(args), "precision": "fp32", "learning_rate": LEARNING_RATE,
                       "clip_grad_norm": CLIP_NORM, "loss_img_weight": 7,
                       "optimizers": {"dalle_pytorch": "torch.optim.Adam(lr) (torch's "
                                                       "default implementation)",
                                      "ours": "make_adam: torch.optim.Adam(lr, fused=True)"},
                       "flop_tolerance": FLOP_TOLERANCE},
          "skipped": skipped, "results": results})


if __name__ == "__main__":
    main()
