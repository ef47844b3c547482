"""What a backend reads: the distributed settings as one typed config, not an argparse Namespace.

The fields are the flags (config_base.option) that `train` and `train-vae` parse (and
`generate`'s --device); code builds one directly (SingleBackend.on, bench scripts).
"""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.backends.precision_kinds import AMP_PRECISION, PRECISIONS
from dalle_dist.backends.watch import DEFAULT_TIMEOUT_S
from dalle_dist.config_base import DictConfig, option

_DEEPSPEED = "deepspeed backend"
_BACKEND = "distributed backend"


@dataclass(frozen=True)
class DistributedConfig(DictConfig):
    """Backend, precision, device and the engine knobs. The backend's flag help (which names
    exist) is the registry's to fill in: this module is below the backends."""

    backend: str | None = option(
        None, "the distributed backend that trains (dalle-dist check says which run here)",
        name="--distributed_backend", aliases=("--distr_backend",), metavar="NAME",
        default_text="default: single", group=_BACKEND)
    deepspeed: bool = option(False, "use the deepspeed backend (as DALLE-pytorch's --deepspeed)",
                             group=_BACKEND)
    precision: str = option(
        PRECISIONS[0], "numbers the step computes in: fp32, or bf16 / fp16 autocast (fp16 "
        "with loss scaling); the optimizer updates fp32 weights", choices=PRECISIONS,
                            shortcuts=(("--fp16", AMP_PRECISION),), group=_BACKEND)
    collective_timeout: float = option(
        DEFAULT_TIMEOUT_S, "how long a rank waits for the others (a step's all-reduce, a "
        "checkpoint save, the built-in VAE) before the run ends with an error naming the wait; "
        "raise it when saving a huge model to a slow disk takes longer", metavar="SECONDS",
        default_text=f"default {DEFAULT_TIMEOUT_S:.0f}: 30 minutes", group=_BACKEND)
    amp: bool = option(False, "fp16 through NVIDIA Apex amp (O1) when it imports on CUDA, else "
                              "torch autocast fp16; the log says which", group=_BACKEND)
    device: str | None = option(
        None, "cpu, cuda or cuda:N",
        default_text="default: the rank's GPU when there is one, else cpu")
    deepspeed_config: str | None = option(
        None, "DeepSpeed JSON merged over the config built from these flags", group=_DEEPSPEED,
        default_text="default: none")
    zero_stage: int = option(0, "ZeRO stage", choices=(0, 1, 2, 3), group=_DEEPSPEED)
    zero_offload: str = option("none", "offload optimizer state to the CPU (ZeRO 1-3)",
                               choices=("none", "cpu"), group=_DEEPSPEED)
    ga_steps: int = option(
        1, "gradient accumulation: micro-batches per optimizer step, on every backend; each "
        "rank's micro-batch is --batch_size / (ranks x GA_STEPS) (Horovod: --batch_size / "
        "GA_STEPS); steps and every interval count optimizer steps", group=_BACKEND)
    #: train's --clip_grad_norm (TrainConfig's flag): DeepSpeed clips inside its engine
    clip_grad_norm: float | None = None

    @property
    def precision_name(self) -> str:
        """What the run trains in: --amp is DALLE-pytorch's fp16 (Apex O1 where it exists)."""
        return AMP_PRECISION if self.amp else self.precision
