"""`dalle-dist selftest`'s flags, as a config like every command's (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.config_base import DictConfig, option


@dataclass(frozen=True)
class SelftestConfig(DictConfig):
    """Where the checks run, how many, and where the report goes."""

    device: str = option(
        "auto", "where the checks run: cuda (the GPU-only checks too: memory against "
        "`dalle-dist plan`, host syncs, CUDA graphs, the time budget), cpu (those say 'not "
        "run'), or auto: cuda when torch sees a GPU, else cpu",
        choices=("auto", "cpu", "cuda"))
    quick: bool = option(
        False, "a shorter run: train every backend once and every precision at least once, "
        "resume in one precision, time each sampling check once; on cuda about 5 minutes "
        "(attention in bf16 only), on the cpu without compiling FlexAttention")
    ranks: int | None = option(
        None, "ranks of the multi-rank checks (one process each, under each backend's "
        "launcher): on CUDA every GPU by default (rounded down to a power of two, at most "
        "8; fewer than 2 GPUs: not run); on the CPU none unless given (2 runs them over "
        "gloo)", metavar="N", default_text="default: every GPU")
    out: str = option(
        "selftest.json", "write the whole report here as JSON: every check's verdict and "
        "the numbers behind it (samples/s, MFU, memory, errors)", metavar="FILE")
