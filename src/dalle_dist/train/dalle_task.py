"""Training DALL-E on image tokens from a frozen VAE (DALLE-pytorch's train_dalle.py).

The VAE encodes every batch before the step, so it runs in the run's precision too: in
bf16/fp16 its convolutions would otherwise be the one fp32 part of a mixed-precision step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn

from dalle_dist.backends import Engine
from dalle_dist.backends.precision import Precision
from dalle_dist.data.images import make_grid
from dalle_dist.data.tokenizer import Tokenizer
from dalle_dist.model import DALLE, DALLEConfig, ImageTokenizer
from dalle_dist.model.init import WeightStream, initial_weights, on_meta
from dalle_dist.train.compile import compile_blocks
from dalle_dist.train.config import EMAConfig, OptimizerConfig, TrainConfig
from dalle_dist.train.optim import embedding_weights, make_optimizer
from dalle_dist.train.schedule import make_lr_scheduler, scheduled_per_step
from dalle_dist.train.task import Batch, Task

SAMPLE_IMAGES = 8


def is_tokens(images: torch.Tensor) -> bool:
    """A batch from token shards holds image token ids, not pixels."""
    return not images.is_floating_point()


def null_captions(text: torch.Tensor, prob: float) -> torch.Tensor:
    """--null_cond_prob: each caption [b, text_seq_len] replaced by the null caption (all
    padding, id 0, which the model turns into its padding tokens) with probability `prob`.

    Drawn on the CPU from the global RNG, which each rank seeds and every checkpoint
    records, so a resumed run draws the same masks; the host tensor needs no device sync.
    The result is pinned when `text` is (the loader pins on CUDA): a product in pageable
    memory would make the step's non_blocking copy to the device a synchronous one."""
    keep = torch.rand(text.shape[0]) >= prob
    out = torch.empty_like(text, pin_memory=text.is_pinned())
    return torch.mul(text, keep.unsqueeze(1).to(text.dtype), out=out)


class DALLETask(Task):
    kind = "dalle"

    def __init__(self, config: DALLEConfig, vae: ImageTokenizer, tokenizer: Tokenizer,
                 train: TrainConfig, data: dict[str, Any], lr_decay: bool,
                 device: torch.device, attn_impl: str = "auto",
                 precision: Precision | None = None,
                 activation_checkpointing: bool = False,
                 compile_backend: str | None = None,
                 optim: OptimizerConfig | None = None,
                 total_steps: int | None = None,
                 ema: EMAConfig | None = None) -> None:
        """vae: the frozen image tokenizer (a DiscreteVAE or a taming VQGAN), saved
        whole in every checkpoint; precision: the run's (backend.precision()), whose
        autocast the frozen VAE encodes under; None: fp32. activation_checkpointing: the
        trained model's blocks recompute their activations in backward (inference copies
        need not). compile_backend: --compile's backend, the trained model's blocks
        compiled with it after checkpointing is set and before any backend wraps the
        model (train/compile.py); None: eager. optim: --optimizer and the learning-rate
        schedule (default: Adam, constant, or plateau with `lr_decay`); total_steps: the
        run's optimizer steps, over which cosine and linear decay. ema: --ema_decay and
        its options (None: no EMA)."""
        self.config, self.train, self.data = config, train, data
        self.precision = precision or Precision("fp32", device)
        self.learning_rate = train.learning_rate
        self.optim = (optim or OptimizerConfig()).resolved(lr_decay, train.learning_rate)
        self.total_steps = total_steps
        self.ema_config = ema or EMAConfig()
        self.ema = self.ema_config.settings()
        self.tokenizer, self.attn_impl = tokenizer, attn_impl
        self.vae = vae.to(device).eval().requires_grad_(False)
        self.model = self.build_model()
        self.model.transformer.set_checkpointing(activation_checkpointing)
        if compile_backend is not None:
            self.compiled = compile_blocks(self.model.transformer, compile_backend)

    def build_model(self) -> nn.Module:
        """On the meta device: shapes only. Training fills it from initial_weights() or a
        checkpoint (FSDP: each rank its own shards); sampling loads gathered weights into
        it with assign=True, so no random values are drawn only to be overwritten."""
        return on_meta(lambda: DALLE(self.config, self.attn_impl))

    def initial_weights(self) -> WeightStream:
        """Drawn from --seed's own generator: the same on every backend and world size."""
        return initial_weights(self.model, self.train.seed)

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """--optimizer over `params` (the model's, as the backend holds them: its
        parameter objects keep their names in self.model through wrapping and sharding)."""
        optim = self.optim
        return make_optimizer(params, optim.optimizer, self.learning_rate, optim.betas,
                              float(optim.weight_decay or 0.0),
                              {id(p): n for n, p in self.model.named_parameters()},
                              embedding_weights(self.model))

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any | None:
        """--lr_schedule (train/schedule.py); plateau is DALLE-pytorch's --lr_decay."""
        return make_lr_scheduler(optimizer, self.optim, self.learning_rate, self.total_steps)

    def after_step(self, step: int, engine: Engine) -> None:
        if engine.scheduler is not None and scheduled_per_step(self.optim):
            engine.scheduler.step()

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module | list[nn.Module]]:
        """One unit per transformer block; blocks that share an attention or feed-forward
        module (--shared_attn_ids / --shared_ff_ids) form one unit together."""
        return [group[0] if len(group) == 1 else list(group)
                for group in model.transformer.shard_groups()]

    def inputs(self, batch: Batch, device: torch.device, training: bool = True
               ) -> tuple[Any, ...]:
        images, text, _ = batch
        images = images.to(device, non_blocking=True)  # async from the loader's pinned memory
        if is_tokens(images):  # --token_shards: encoded once, before training
            image_tokens = images.long()
        else:
            with torch.no_grad(), self.precision.autocast():
                image_tokens = self.vae.get_codebook_indices(images)
        if training and self.config.null_cond_prob > 0:
            text = null_captions(text, self.config.null_cond_prob)
        return text.to(device, non_blocking=True), image_tokens

    def after_epoch(self, epoch: int, mean_loss: float, engine: Engine) -> None:
        if engine.scheduler is not None and not scheduled_per_step(self.optim):
            engine.scheduler.step(mean_loss)

    @torch.no_grad()
    def sample_grid(self, model: nn.Module, batch: Batch, device: torch.device) -> Image.Image:
        """Top row: training images; bottom row: images sampled from their captions."""
        images, text, _ = batch
        images, text = images[:SAMPLE_IMAGES].to(device), text[:SAMPLE_IMAGES].to(device)
        if is_tokens(images):  # token shards: the top row is what their tokens decode to
            images = self.vae.decode(images.long()).float()
        generated = model.generate_images(text, self.vae, filter_thres=0.9)
        return make_grid(torch.cat([images, generated.float()]).cpu(), nrow=len(images))

    def configs(self) -> dict[str, Any]:
        return {"model": self.config.to_dict(), "vae": self.vae.config.to_dict(),
                "train": self.train.to_dict(), "data": self.data,
                "tokenizer": self.tokenizer.to_dict(),
                "optimizer": {**self.optim.to_dict(), "schedule_steps": self.total_steps},
                "ema": self.ema_config.to_dict() if self.ema is not None else None}

    def extra_state(self) -> dict[str, Any]:
        return {"vae_weights": self.vae.state_dict()}
