"""A `Signature`: one failure (or harmless warning) `dalle-dist doctor` recognises, as data.

Fields
    id        unique, short, kebab-case.
    category  one of CATEGORIES below (benign entries use BENIGN).
    patterns  Python regexes, each searched in one log line at a time (re.MULTILINE, so
              `^` and `$` are a line's ends; no pattern may span lines). Rank prefixes
              such as `[rank0]:`, `[1,0]<stderr>:` or DeepSpeed's `[<time>] [INFO] [...]`
              are stripped before matching. Named groups `(?P<name>...)` fill `{name}`
              placeholders in cause, fix and check.
    cause     what went wrong, in a sentence, for the user.
    fix       what to do about it.
    check     one shell command that shows whether the fix worked.
    priority  the entry's rank among all signatures, lowest first (unique; see
              dalle_dist.doctor.signatures for the bands). Among equally telling lines
              the entry of lowest priority decides; a line several entries match is
              harmless or a failure as the one of lowest priority says.
    benign    True for a harmless warning: it never decides the category of a log that
              also holds a failure; it is listed as a note.
    requires  regexes of which at least one must occur somewhere in the log for the
              entry to apply (context a single line cannot give, e.g. "fp16 was on", or
              which library's frames a removed-module ImportError passes through).
    scale_at_most
              makes the entry a sequence: every pattern captures the new loss scale in a
              group `scale`, and the entry applies only when the scale falls to this value
              or below somewhere in the log; it then decides on the first such line. A
              loss scaler's warm-up halves the scale a few times from 2**16 or 2**32 and
              settles; a scale halved step after step down to single digits means every
              step overflows (fp16 has diverged). The same lines above the floor stay the
              harmless warm-up notes.
    fallback  a catch-all (e.g. any NCCL error): it decides only when no specific entry
              matched, however telling its line; NCCL wraps other causes (a CUDA OOM, a
              duplicate GPU) in its own error line.

Patterns key on the stable part of a message (the engine's wording), never on versions,
paths, ranks or sizes; `doctor` removes timestamps, CI and logger prefixes, rank prefixes
and ANSI colours, and makes typographic punctuation plain (curly quotes, an en/em dash for
an option's `--`, no-break spaces), before matching: write patterns in ASCII.

Categories
    deepspeed-missing             DeepSpeed is not installed or not importable.
    deepspeed-op-build            a DeepSpeed C++/CUDA op (fused_adam, cpu_adam, ...) or
                                  its wheel failed to build or JIT-load.
    cuda-unavailable-or-mismatch  no usable GPU: CPU-only torch, no or old driver, a GPU
                                  this torch has no kernels for, fp16/bf16 not possible.
    cuda-oom                      a GPU ran out of memory.
    apex-missing-or-wrong         NVIDIA Apex absent, built without its extensions, or
                                  the unrelated PyPI `apex`; DeepSpeed's removed amp.
    horovod-not-built             Horovod absent, or built without torch / Gloo / MPI.
    nccl-comm                     ranks cannot talk: NCCL errors, collective timeouts,
                                  rendezvous store connections.
    sparse-attn-triton            DeepSpeed's sparse attention or Triton cannot load or run
                                  (missing, a version torch or DeepSpeed does not
                                  expect, torch.compile's inductor finding none); a
                                  library that only notes Triton is absent is benign.
    zero-checkpoint               a DeepSpeed ZeRO checkpoint that is incomplete or was
                                  saved by another number of ranks.
    fp16-overflow                 fp16 training diverged: the loss scale collapsed to its
                                  minimum, or the loss became NaN with fp16 on.
    launcher-args                 the launcher or the command line is wrong: unknown or
                                  missing arguments, no launcher environment, busy port.
    batch-size                    the batch does not fit the ranks / gradient accumulation,
                                  or the data holds fewer samples than one batch.
    other                         a known failure outside those: host RAM exhausted
                                  (SIGKILL), disk full, NaN loss without fp16, or any
                                  other `error: ... (fix)` line of dalle-dist.
Two further values are results, not entries: `benign` (BENIGN) when only harmless
warnings matched, and `unknown` (UNKNOWN) when nothing matched; doctor never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES: tuple[str, ...] = (
    "deepspeed-missing", "deepspeed-op-build", "cuda-unavailable-or-mismatch", "cuda-oom",
    "apex-missing-or-wrong", "horovod-not-built", "nccl-comm", "sparse-attn-triton",
    "zero-checkpoint", "fp16-overflow", "launcher-args", "batch-size", "other",
)
BENIGN = "benign"
UNKNOWN = "unknown"

# "loss=nan" (tqdm), "loss - nan" (DALLE-pytorch), "loss: nan", '"loss": NaN' (JSON lines),
# "Loss is nan, stopping training" (DETR, and DeiT, MAE and the models built on them).
# Read by fp16-nan-loss (fp16 on) and nan-loss (other) alike.
NAN_LOSS = r"(?i)\bloss['\"]?(?:[ \t]*[:=-]?[ \t]*|[ \t]+is[ \t]+)nan\b"


@dataclass(frozen=True)
class Signature:
    """One recognisable failure (or harmless warning); see the module docstring."""

    id: str
    category: str
    patterns: tuple[str, ...]
    cause: str
    fix: str
    check: str
    benign: bool = False
    requires: tuple[str, ...] = ()
    scale_at_most: float | None = None
    fallback: bool = False
    priority: int = field(kw_only=True)   # lowest first; unique across all modules
