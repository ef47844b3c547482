"""`train --compile` against eager: training step time, in turns in one process, printed
as JSON.

Two copies of one DALL-E (same weights, same Adam, same batch): one eager, one with its
blocks compiled as `train --compile` compiles them (dalle_dist.train.compile). Each round
takes one step of each, the order swapped every round, so both see the same machine state
(the lead's other processes on a 2-core VM move a timing; taking turns moves both alike).
A step = forward + backward + clip + Adam on given image tokens (the loop's step without
the frozen VAE's encoding, which --compile leaves eager and which costs both the same).
The compiled copy compiles at its first step, inside the warm-up rounds; its compile
time is that step's time less the compiled median, as the training log reports it.

Defaults (issue 25): dim 256, depth 4, 4 heads x 64, text 32, fp32, 2 threads; 256 image
tokens at batch 8 and 1024 at batch 2, the pattern `full`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    comma_list,
    compile_fresh,
    emit,
    keep_train_heap,
    median,
    positive_ints,
    require_positive,
    set_threads,
    square_tokens,
)

from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.config import COMPILE_BACKENDS
from dalle_dist.model.patterns import PATTERNS
from dalle_dist.train.compile import DEFAULT_BACKEND
from dalle_dist.train.optim import make_adam

#: (image tokens, batch): issue 25's two sizes
SIZES = ((256, 8), (1024, 2))


def measure(tokens: int, batch: int, args: argparse.Namespace) -> dict[str, object]:
    """Eager and compiled steps of one size in turns; their medians, the compile time and
    the steps after which the compiled copy has paid for it."""
    side = math.isqrt(tokens)
    cfg = DALLEConfig(num_text_tokens=1000, text_seq_len=args.text_seq_len,
                      num_image_tokens=512, image_fmap_size=side, dim=args.dim,
                      depth=args.depth, heads=args.heads, dim_head=args.dim_head,
                      attn_types=tuple(args.attn_types))
    torch.manual_seed(0)
    eager = DALLE(cfg)
    compiled = DALLE(cfg)
    compiled.load_state_dict(eager.state_dict())
    blocks = compile_fresh(compiled.transformer, args.backend)
    optimizers = {"eager": make_adam(eager.parameters(), 3e-4),
                  "compiled": make_adam(compiled.parameters(), 3e-4)}
    models = {"eager": eager, "compiled": compiled}
    text = torch.randint(1, 1000, (batch, args.text_seq_len))
    text[:, args.text_seq_len // 2:] = 0  # half padding, like real captions
    image_tokens = torch.randint(0, 512, (batch, tokens))
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    losses: dict[str, list[float]] = {"eager": [], "compiled": []}
    first_compiled: list[float] = []

    def step(name: str) -> float:
        start = time.perf_counter()
        loss = models[name](text, image_tokens)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(models[name].parameters(), 0.5)
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        losses[name].append(loss.item())
        return seconds

    for round_ in range(args.warmup + args.rounds):
        order = ("eager", "compiled") if round_ % 2 == 0 else ("compiled", "eager")
        for name in order:
            seconds = step(name)
            if round_ >= args.warmup:
                times[name].append(seconds)
            elif name == "compiled":
                first_compiled.append(seconds)
    eager_s, compiled_s = median(times["eager"]), median(times["compiled"])
    compile_s = first_compiled[0] - compiled_s  # the first step compiled
    gain = eager_s - compiled_s
    gap = max(abs(a - b) / abs(a) for a, b in zip(losses["eager"], losses["compiled"],
                                                  strict=True))
    return {
        "image_tokens": tokens, "batch": batch,
        "eager_step_s": round(eager_s, 4), "compiled_step_s": round(compiled_s, 4),
        "speedup": round(eager_s / compiled_s, 3),
        "eager_samples_per_s": round(batch / eager_s, 2),
        "compiled_samples_per_s": round(batch / compiled_s, 2),
        "compile_s": round(compile_s, 1), "graphs": blocks.graphs,
        "pays_off_after_steps": math.ceil(compile_s / gain) if gain > 0 else None,
        "max_loss_gap_rel": gap,  # same weights and batches: fp32 rounding only
        "eager_step_times_s": [round(t, 4) for t in times["eager"]],
        "compiled_step_times_s": [round(t, 4) for t in times["compiled"]],
    }


def checked_size(parser: argparse.ArgumentParser, size: str) -> tuple[int, int]:
    """One --sizes entry, TOKENSxBATCH: positive, with a square token count (the grid)."""
    if size.count("x") != 1:
        parser.error(f"--sizes: {size!r} is not IMAGE_TOKENSxBATCH (e.g. 256x8)")
    tokens, batch = positive_ints(parser, "--sizes", size, sep="x")
    return square_tokens(parser, "--sizes", tokens), batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per size")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed rounds first (the compile happens in the first)")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim_head", type=int, default=64)
    parser.add_argument("--text_seq_len", type=int, default=32)
    parser.add_argument("--attn_types", default="full")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, choices=COMPILE_BACKENDS,
                        help="torch.compile backend (train --compile_backend)")
    parser.add_argument("--sizes", default=",".join(f"{t}x{b}" for t, b in SIZES),
                        help="image tokens x batch, comma list (default 256x8,1024x2)")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: the compile happens in the first round")
    require_positive(parser, args, "threads", "rounds", "dim", "depth", "heads", "dim_head",
                     "text_seq_len")
    args.attn_types = comma_list(parser, "--attn_types", args.attn_types, PATTERNS)
    sizes = [checked_size(parser, size) for size in comma_list(parser, "--sizes", args.sizes)]
    set_threads(args.threads)
    heap_kept = keep_train_heap()  # both copies step in this process, as train's would
    emit({"bench": "compile_speedup", "config": vars(args), "torch": torch.__version__,
          "heap_kept": heap_kept,
          "results": [measure(tokens, batch, args) for tokens, batch in sizes]})


if __name__ == "__main__":
    main()
