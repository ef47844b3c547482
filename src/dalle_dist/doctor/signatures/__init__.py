"""What `dalle-dist doctor` knows: failure signatures of distributed DALL-E training, as data.

Each `Signature` (base.py: its fields, the categories) names one recognisable failure, or
one harmless warning, by the lines the engines really print. They are kept by what they
are about, one module per category or two close ones, each module also holding the
harmless warnings of its topic:

    fp16             fp16-overflow: collapsed loss scales, NaN with fp16; warm-up overflows
    cuda             cuda-oom, cuda-unavailable-or-mismatch
    triton           sparse-attn-triton; libraries noting Triton is absent
    deepspeed        deepspeed-missing, deepspeed-op-build; launcher and op-builder notices
    horovod          horovod-not-built
    apex             apex-missing-or-wrong; Apex's fallback notices
    zero_checkpoint  zero-checkpoint
    batch_size       batch-size
    launcher         launcher-args; torchrun's OMP_NUM_THREADS notice
    comm             nccl-comm (NCCL, gloo, Horovod stalls); DDP's grad-strides warning
    other            other: host RAM, shared memory, disk, NaN without fp16, dalle-dist's
                     own `error: ... (fix)` lines

Priority: SIGNATURES is every module's entries sorted by `priority`, lowest first, and that
order is a ranking: `doctor` first prefers the most telling place in the log (torchrun's
"Root Cause" section, then exception and `error:` lines, then any line) and, among equally
telling lines, the entry of lowest priority; a line several entries match is harmless or a
failure as the one of lowest priority says. Root causes rank before the symptoms that
usually follow them (a rank's CUDA OOM before the other ranks' NCCL timeouts), specific
entries before generic ones that read the same line. Priorities are unique, in bands of a
hundred, by what comes first:

     100  fp16 loss scale collapse      900  ZeRO checkpoints
     200  CUDA out of memory           1000  batch size
     300  CUDA missing or mismatched   1100  NaN loss with fp16 on
     400  Triton, sparse attention     1200  launcher and command line
     500  DeepSpeed op builds          1300  communication between ranks
     600  DeepSpeed missing            1400  other known failures
     700  Horovod                      1500  harmless warnings
     800  Apex

Within a band entries step by 5, leaving room to place a new one between two others.
A module may hold entries of several bands (fp16's NaN loss, its warm-up notes): the
priority, not the module or the place in it, says where an entry ranks.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures import (
    apex,
    batch_size,
    comm,
    cuda,
    deepspeed,
    fp16,
    horovod,
    launcher,
    other,
    triton,
    zero_checkpoint,
)
from dalle_dist.doctor.signatures.base import BENIGN, CATEGORIES, UNKNOWN, Signature

__all__ = ["BENIGN", "CATEGORIES", "SIGNATURES", "UNKNOWN", "Signature"]

MODULES = (fp16, cuda, triton, deepspeed, horovod, apex, zero_checkpoint, batch_size,
           launcher, comm, other)
#: Every signature, lowest priority first (see the module docstring).
SIGNATURES: tuple[Signature, ...] = tuple(sorted(
    (signature for module in MODULES for signature in module.SIGNATURES),
    key=lambda signature: signature.priority))
