"""`dalle-dist plan`'s own flags: the machines to plan for and how to print the plan.

The model, tokenizer, VAE and batch flags are `train`'s own configs; these say what the
run would get (GPUs and their memory), what to compare and how to answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.config_base import DictConfig, option

#: the byte tokenizer's vocabulary (data.tokenizer.ByteTokenizer): UTF-8 bytes + padding id 0
BYTE_VOCAB = 257


@dataclass(frozen=True)
class PlanConfig(DictConfig):
    """The GPUs a plan is for, the precisions it compares and its output form."""

    num_text_tokens: int = option(
        BYTE_VOCAB, "tokenizer vocabulary, padding id included; --bpe_path replaces it with "
        "its file's vocabulary", metavar="N",
        default_text=f"default {BYTE_VOCAB}: the byte tokenizer")
    gpus: int = option(1, "GPUs the global batch is split over", metavar="N")
    gpu_memory: str = option(
        "80GB", "memory of one GPU: 80GB, 40GiB, 24G, 16000MB (GB and G decimal, GiB binary)",
        metavar="SIZE")
    precisions: str | None = option(
        None, "only these of fp32, bf16, fp16 (comma list)", name="--precision",
        metavar="LIST", default_text="default: all")
    device: str = option(
        "cuda", "count activations for this device's attention kernels", choices=("cuda", "cpu"))
