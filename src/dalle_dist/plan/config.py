"""`dalle-dist plan`'s own flags: the machines to plan for and how to print the plan.

The model, tokenizer, VAE and batch flags are `train`'s own configs; these say what the
run would get (GPUs and their memory), what to compare and how to answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.config_base import DictConfig, option
from dalle_dist.errors import ConfigError

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


@dataclass(frozen=True)
class SbatchConfig(DictConfig):
    """`plan --sbatch`: the chosen row as a Slurm batch script (plan/sbatch.py)."""

    sbatch: bool = option(
        False, "print a Slurm batch script for the recommended row instead of the table: "
        "srun as the launcher, SIGUSR1 before the time limit, a save and a requeue, "
        "--resume auto", group="Slurm script (--sbatch)")
    nodes: int = option(1, "nodes the job takes", metavar="N", group="Slurm script (--sbatch)")
    gpus_per_node: int = option(
        1, "GPUs (tasks) per node; --gpus becomes nodes x this", metavar="N",
        group="Slurm script (--sbatch)")
    signal_margin: int = option(
        120, "seconds before the time limit at which the job is sent SIGUSR1 (to save, then "
        "requeue): more than a save takes", metavar="S", group="Slurm script (--sbatch)")
    time: str | None = option(
        None, "the job's time limit, as sbatch's --time (e.g. 24:00:00)", metavar="TIME",
        default_text="default: the partition's", group="Slurm script (--sbatch)")
    partition: str | None = option(
        None, "sbatch --partition", metavar="NAME", default_text="default: the cluster's",
        group="Slurm script (--sbatch)")
    job_name: str = option("dalle", "the job's name, and its log's: NAME-JOBID.out",
                           metavar="NAME", group="Slurm script (--sbatch)")
    output: str = option("dalle", "train's --dalle_output_file_name", metavar="NAME",
                         group="Slurm script (--sbatch)")

    def validate(self) -> None:
        for flag, value, least in (("--nodes", self.nodes, 1),
                                   ("--gpus_per_node", self.gpus_per_node, 1),
                                   ("--signal_margin", self.signal_margin, 1)):
            if value < least:
                raise ConfigError(f"{flag} must be >= {least}, got {value}")
