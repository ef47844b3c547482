"""Static-shape decoding: image tokens sampled through a preallocated KV cache.

Every decode step feeds one image token per row at a grid cell given as a tensor and
attends over the whole preallocated cache, so all steps have the same shapes and can be
compiled once: `torch.compile` on CPU, CUDA graphs (mode "reduce-overhead") on CUDA.
Sampling itself (top-k, Gumbel noise from the caller's generator) runs outside the
compiled step, so the generator's stream is the one eager sampling consumes.

Nothing in the loop reads a device value on the host: positions are tensors, tokens are
written into a device buffer, and the step number is only a Python loop counter.

Classifier-free guidance (cond_scale != 1) doubles the batch: rows [0, b) carry the
captions, rows [b, 2b) the null caption, each row with its own slots of the one cache, so
both passes run as one forward per token; the sampled token is fed to both halves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from dalle_dist.model.modes import eval_mode
from dalle_dist.model.sampling import guide, null_text, sample_tokens

if TYPE_CHECKING:
    from dalle_dist.model.attention import LayerKVCache
    from dalle_dist.model.patterns import SequenceLayout
    from dalle_dist.model.transformer import Transformer


class _Embedding(Protocol):
    @property
    def weight(self) -> Tensor: ...


class DecodedModel(Protocol):
    """What decoding needs from the model whose image tokens it samples (DALLE is one).

    The model is an nn.Module: the decoder holds it as a submodule and runs it in eval mode.
    A protocol, not DALLE itself: dalle.py imports this module (DALLE.sample_image_tokens
    builds a StaticDecoder), so this module does not import dalle.py.
    """

    @property
    def layout(self) -> SequenceLayout: ...

    @property
    def transformer(self) -> Transformer: ...  # its new_cache

    @property
    def text_emb(self) -> _Embedding: ...  # its weight's dtype and device are the cache's

    def prefill(self, text: Tensor, cache: Sequence[LayerKVCache]) -> Tensor:
        """Image logits [b, vocab] of the first image cell; fills the cache with the text."""
        ...

    def decode_step(self, tokens: Tensor, cell: Tensor, cache: Sequence[LayerKVCache]) -> Tensor:
        """Image logits [b, vocab] of the cell after `cell`, given its tokens [b, 1]."""
        ...

    def uncached_image_logits(self, text: Tensor, tokens: Tensor) -> Tensor:
        """The next image token's logits from one forward over the whole sequence."""
        ...


def cache_dtype(weight_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's dtype for a model whose weights are `weight_dtype`: the weights' own,
    except bf16 / fp16 on a CPU, where the cache and so the attention over it stay fp32.
    CPU attention kernels in half precision are several times slower than fp32 at decode
    shapes (docs/benchmarks.md, "Sampling"), while the cache's bytes are a small part of
    what a step reads next to the weights. On CUDA half-precision attention is native and
    the cache keeps half the bytes."""
    if device.type == "cpu" and weight_dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return weight_dtype


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

    def __init__(self, model: DecodedModel, batch: int, compiled: bool = False,
                 dtype: torch.dtype | None = None, cond_scale: float = 1.0) -> None:
        """cond_scale: classifier-free guidance (1: none, and no null pass). dtype: the
        KV cache's (default: cache_dtype of the model's weights on their device)."""
        super().__init__()
        weight = model.text_emb.weight
        self.model = model
        self.batch = batch
        self.compiled = compiled
        self.cond_scale = cond_scale
        self.rows = batch * 2 if self.guided else batch  # the null half when guided
        self.caches = model.transformer.new_cache(
            self.rows, model.layout, weight.device,
            dtype or cache_dtype(weight.dtype, weight.device))
        self.register_buffer("cells", torch.arange(model.layout.image_len, device=weight.device),
                             persistent=False)
        self._step: Callable[[Tensor, Tensor], Tensor] = self.step
        if compiled:
            self._step = torch.compile(self.step, mode=compile_mode(weight.device),
                                       fullgraph=True, dynamic=False)

    @property
    def device(self) -> torch.device:
        return self.cells.device

    @property
    def guided(self) -> bool:
        return self.cond_scale != 1.0

    def next_logits(self, logits: Tensor) -> Tensor:
        """The logits [batch, vocab] tokens are drawn from: guided from the two halves of
        the doubled batch, or the model's own."""
        if not self.guided:
            return logits
        cond, null = logits.chunk(2)
        return guide(cond, null, self.cond_scale)

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
        with eval_mode(model):
            n_image, b = model.layout.image_len, self.batch
            tokens = torch.empty(self.rows, n_image, dtype=torch.long, device=self.device)
            if self.guided:
                text = torch.cat([text, null_text(text)])
            logits = model.prefill(text, self.caches)
            graphs = self.compiled and self.device.type == "cuda"
            for j in range(n_image):
                tokens[:b, j] = sample_tokens(self.next_logits(logits), filter_thres,
                                              temperature, generator)
                if self.guided:
                    tokens[b:, j] = tokens[:b, j]  # the null pass continues the same image
                if j == n_image - 1:
                    break
                if graphs:
                    # The last step's logits are consumed: its graph's outputs may be reused.
                    torch.compiler.cudagraph_mark_step_begin()
                logits = self._step(tokens[:, j:j + 1], self.cells[j:j + 1])
            return tokens[:b]


@torch.no_grad()
def teacher_forced_logits(model: DecodedModel, text: Tensor, tokens: Tensor
                          ) -> tuple[Tensor, Tensor]:
    """([n, b, vocab] image logits of the cached decoder, the same from uncached forwards),
    both fed the same image tokens [b, n]: the prefill's logits, then one decode step's per
    token but the last. How a cast model's cache is checked: in bf16 / fp16 a near tie in
    the Gumbel argmax can flip with the summation order, so sampled tokens need not match
    token for token, while these logits must agree within the dtype's rounding. float32;
    the model runs in eval mode (no dropout) and is left in the mode it was in."""
    decoder = StaticDecoder(model, text.shape[0])
    with eval_mode(model):
        cached = [model.prefill(text, decoder.caches)]
        uncached = [model.uncached_image_logits(text, tokens[:, :0])]
        for j in range(tokens.shape[1] - 1):
            cached.append(decoder.step(tokens[:, j:j + 1], decoder.cells[j:j + 1]))
            uncached.append(model.uncached_image_logits(text, tokens[:, :j + 1]))
    return torch.stack(cached).float(), torch.stack(uncached).float()
