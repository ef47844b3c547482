"""Static-shape decoding: image tokens sampled through a preallocated KV cache.

Every decode step feeds one image token per row at a grid cell given as a tensor and
attends over the whole preallocated cache, so all steps have the same shapes and can be
compiled once: `torch.compile` on CPU, CUDA graphs (mode "reduce-overhead") on CUDA.
Sampling itself (top-k, Gumbel noise from the caller's generator) runs outside the
compiled step, so the generator's stream is the one eager sampling consumes.

Nothing in the loop reads a device value on the host: positions are tensors, tokens are
written into a device buffer, and the step number is only a Python loop counter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dalle_dist.model.sampling import sample_tokens

if TYPE_CHECKING:
    from dalle_dist.model.dalle import DALLE


def compile_mode(device: torch.device) -> str:
    """CUDA graphs where kernel launches dominate a step (CUDA); plain Inductor elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else "default"


class StaticDecoder(nn.Module):
    """Samples image tokens for a fixed batch size, reusing one preallocated cache.

    Build one per (model, batch size) and call `sample` as often as needed: the cache is
    overwritten from position 0 by every prefill, and a compiled step is compiled on the
    first call only. With `compiled` the step goes through torch.compile (fullgraph, static
    shapes); without it the same step runs eagerly, which is what `DALLE.sample_image_tokens`
    does by default.
    """

    def __init__(self, model: DALLE, batch: int, compiled: bool = False,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        weight = model.text_emb.weight
        self.model = model
        self.batch = batch
        self.compiled = compiled
        self.caches = model.transformer.new_cache(batch, model.layout, weight.device,
                                                  dtype or weight.dtype)
        self.register_buffer("cells", torch.arange(model.layout.image_len, device=weight.device),
                             persistent=False)
        self._step: Callable[[Tensor, Tensor], Tensor] = self.step
        if compiled:
            self._step = torch.compile(self.step, mode=compile_mode(weight.device),
                                       fullgraph=True, dynamic=False)

    @property
    def device(self) -> torch.device:
        return self.cells.device

    def step(self, tokens: Tensor, cell: Tensor) -> Tensor:
        """Image logits [b, vocab] for the cell after `cell` ([1]), given its tokens [b, 1]."""
        return self.model.decode_step(tokens, cell, self.caches)

    @torch.no_grad()
    def sample(self, text: Tensor, filter_thres: float = 0.5, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> Tensor:
        """[batch, fmap^2] image token ids for [batch, text_seq_len] captions."""
        if text.shape[0] != self.batch:
            raise ValueError(f"this decoder samples batches of {self.batch}, got {text.shape[0]}")
        model = self.model
        was_training = model.training
        model.eval()
        try:
            n_image = model.layout.image_len
            tokens = torch.empty(self.batch, n_image, dtype=torch.long, device=self.device)
            logits = model.prefill(text, self.caches)
            graphs = self.compiled and self.device.type == "cuda"
            for j in range(n_image):
                tokens[:, j] = sample_tokens(logits, filter_thres, temperature, generator)
                if j == n_image - 1:
                    break
                if graphs:
                    # The last step's logits are consumed: its graph's outputs may be reused.
                    torch.compiler.cudagraph_mark_step_begin()
                logits = self._step(tokens[:, j:j + 1], self.cells[j:j + 1])
            return tokens
        finally:
            model.train(was_training)
