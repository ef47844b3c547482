"""The signatures' explicit priorities give the order doctor's verdicts were written against.

Until issue 23 the signatures were one list whose order was an unwritten priority; they are
now one module per category, each entry with its `priority`, and SIGNATURES is every
module's entries sorted by it. OLD_ORDER is that list's order, id for id: a priority that
moves an entry past another changes which one decides a tie, which claims a shared line,
and the order of notes and alternatives, so it must be a deliberate edit of this list too.
"""

from __future__ import annotations

import pkgutil

from dalle_dist.doctor import signatures
from dalle_dist.doctor.signatures import MODULES, SIGNATURES

#: SIGNATURES as the single list held them (dalle_dist/diagnose/signatures.py, issue 22),
#: with the entries added since in their places (torch.compile's build tools, issue 25).
OLD_ORDER = (
    "ds-loss-scale-at-minimum", "apex-loss-scale-collapse", "ds-loss-scale-collapse",
    "lg-loss-scale-collapse", "loss-scale-column-collapse", "sampling-nan-probabilities",
    "cuda-out-of-memory", "torch-cpu-build", "nvidia-driver-missing", "nvidia-driver-too-old",
    "gpu-arch-unsupported", "no-gpu-visible", "cuda-is-available-false", "libcudart-missing",
    "fp16-without-gpu", "bf16-unsupported", "triton-optional-missing",
    "triton-optional-notice", "triton-unusable", "triton-c-compiler-missing", "triton-missing",
    "triton-api-mismatch",
    "ds-sparse-attention-unavailable", "ds-sparse-attention-fp16-only",
    "ds-cuda-home-missing", "ds-cuda-toolkit-mismatch", "torch-ext-cuda-mismatch",
    "ds-ninja-missing", "ds-op-build-failed", "deepspeed-not-installed",
    "deepspeed-version-pin", "deepspeed-torch-too-new", "deepspeed-install-failed",
    "horovod-torch-extension", "horovod-transport-missing", "horovod-build-failed",
    "horovod-not-installed", "apex-python-fallback", "apex-optional-missing",
    "dalle-dist-amp-fallback", "deepspeed-amp-removed", "apex-pypi-impostor",
    "apex-torch-too-new", "deepspeed-torch-too-new-wrapped", "apex-amp-missing",
    "apex-amp-not-imported", "apex-build-cuda-mismatch", "apex-extensions-missing",
    "apex-extension-stale", "apex-not-installed", "zero-world-size-changed",
    "zero3-placeholder-weights", "zero-partition-missing", "batch-not-divisible",
    "batch-larger-than-data", "fp16-nan-loss", "local-rank-unrecognized", "bad-arguments",
    "no-launcher-environment", "port-in-use", "nccl-duplicate-gpu", "nccl-network",
    "dalle-dist-peer-lost", "horovod-stall", "horovod-shut-down", "gloo-timeout",
    "ddp-grad-strides-mismatch", "collective-timeout", "nccl-error", "host-oom-killed",
    "inductor-cxx-compiler-missing", "python-headers-missing", "disk-full",
    "checkpoint-file-unwritable", "shared-memory-exhausted", "nan-loss",
    "dalle-dist-error", "ds-overflow-skip", "apex-gradient-overflow", "torchrun-omp-threads",
    "ds-cuda-minor-mismatch-accepted", "ds-launcher-notices",
)


def test_priorities_are_unique_integers() -> None:
    priorities = [s.priority for s in SIGNATURES]
    assert all(type(p) is int for p in priorities)
    duplicates = sorted({p for p in priorities if priorities.count(p) > 1})
    assert not duplicates, [(s.id, s.priority) for s in SIGNATURES if s.priority in duplicates]


def test_the_table_is_sorted_by_priority_and_keeps_the_old_order() -> None:
    assert [s.priority for s in SIGNATURES] == sorted(s.priority for s in SIGNATURES)
    assert tuple(s.id for s in SIGNATURES) == OLD_ORDER


def test_every_signature_module_is_in_the_table() -> None:
    """A module left out of MODULES would drop its signatures without a sound; each module
    lists its own entries lowest priority first, as they rank."""
    found = {name for _, name, _ in pkgutil.iter_modules(signatures.__path__)} - {"base"}
    assert found == {module.__name__.rpartition(".")[2] for module in MODULES}
    assert sum(len(module.SIGNATURES) for module in MODULES) == len(SIGNATURES)
    for module in MODULES:
        own = [s.priority for s in module.SIGNATURES]
        assert own == sorted(own), module.__name__
