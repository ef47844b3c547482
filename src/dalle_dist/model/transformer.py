"""Pre-norm transformer whose layers cycle through attention patterns."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dalle_dist.model.attention import Attention, LayerKVCache
from dalle_dist.model.patterns import PatternOptions, SequenceLayout, build_pattern
from dalle_dist.model.rotary import RotaryEmbedding, Rotation
from dalle_dist.model.shift import ShiftRows, shift_tokens


class FeedForward(nn.Module):
    """GEGLU feed-forward, as DALLE-pytorch uses.

    Value and gate are two projections rather than one split in half: the split's backward
    concatenates the two gradients, a full copy of the widest activation in every layer.
    """

    def __init__(self, dim: int, mult: int, dropout: float) -> None:
        super().__init__()
        self.to_value = nn.Linear(dim, dim * mult)
        self.to_gate = nn.Linear(dim, dim * mult)
        self.dropout = nn.Dropout(dropout)
        self.proj_out = nn.Linear(dim * mult, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj_out(self.dropout(self.to_value(x) * F.gelu(self.to_gate(x))))


class LayerScale(nn.Module):
    """DALLE-pytorch 1.x's LayerScale (CaiT, arXiv 2103.17239): a branch's output times a
    learned per-channel vector. It belongs to the layer, not to the branch's module, so
    layers that share an attention or feed-forward module keep their own scales."""

    def __init__(self, dim: int, layer: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(dim))
        #: DALLE-pytorch's starting value, by layer number (model/init.py fills it)
        self.initial = 0.1 if layer <= 18 else 1e-5 if layer <= 24 else 1e-6

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int, attn_dropout: float,
                 ff_dropout: float, pattern_name: str, options: PatternOptions,
                 attn_impl: str, stable: bool, shift: bool = False,
                 layer_scale: int | None = None, rotate_values: bool = False) -> None:
        """layer_scale: this layer's number (from 1) when its branches are scaled
        (DALLEConfig.layer_scale), else None."""
        super().__init__()
        self.shift = shift  # --shift_tokens (model/shift.py) on the normalised inputs
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dim_head, attn_dropout,
                              build_pattern(pattern_name, options), attn_impl, stable,
                              rotate_values)
        self.ff_norm = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, ff_mult, ff_dropout)
        self.attn_scale = LayerScale(dim, layer_scale) if layer_scale else None
        self.ff_scale = LayerScale(dim, layer_scale) if layer_scale else None
        #: --activation_checkpointing: recompute this block in backward (set_checkpointing)
        self.checkpointing = False
        #: train --compile: train_step compiled (compile_training); None: eager
        self.compiled: Callable[..., Tensor] | None = None
        #: False: training calls run eager for now (Transformer.use_compiled)
        self.use_compiled = True
        self._warm = False  # the attention's caches are built (_warm_up)

    def compile_training(self, compile_fn: Callable[[Callable[..., Tensor]],
                                                    Callable[..., Tensor]]) -> None:
        """Training calls run `compile_fn(self.train_step)` (e.g. torch.compile); sampling
        (a cache) and gradient-free calls (validation) stay eager, so they never cost a
        recompile. Hooks on the block (FSDP2's gathers) and on its parameters (DDP's,
        Horovod's gradient hooks) stay outside the compiled call: the module's own
        __call__ and autograd run them."""
        self.compiled = compile_fn(self.train_step)

    def forward(self, x: Tensor, layout: SequenceLayout, cache: LayerKVCache | None = None,
                positions: Tensor | None = None, rotation: Rotation | None = None) -> Tensor:
        if cache is None and torch.is_grad_enabled():
            if self.compiled is None or not self.use_compiled:
                return self.train_step(x, layout, rotation)
            if not self._warm:
                self._warm_up(x, layout, rotation)
            return self.compiled(x, layout, rotation)
        return self.residual(x, layout, cache, positions, rotation)

    def _warm_up(self, x: Tensor, layout: SequenceLayout, rotation: Rotation | None) -> None:
        """One eager forward before the first compiled call, without gradients and on a
        forked RNG (the run's random streams stay those of a run without it). The
        attention layer builds its masks and block indices on first use and keeps them in
        dicts: built inside a traced call, each would be a side effect that dynamo replays
        and then guards on, so the next call would compile the block again (and inside the
        checkpoint's region dynamo refuses it); a sparse layout's random blocks cannot be
        traced at all. Built here, the traced call only reads them."""
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            self.residual(x, layout, None, None, rotation)
        self._warm = True

    def train_step(self, x: Tensor, layout: SequenceLayout,
                   rotation: Rotation | None = None) -> Tensor:
        """A training call (whole sequence, no cache, gradients on): what train --compile
        compiles. With checkpointing only x is kept for backward, which recomputes the
        block, dropout masks included (the RNG state is restored); compiled, dynamo traces
        the checkpoint as one region the backward graph recomputes. The checkpoint sits
        inside the block's own call, so a block that is an FSDP2 unit has its gather hooks
        outside the recomputed region (torchtitan's order)."""
        if self.checkpointing:
            return checkpoint(self.residual, x, layout, None, None, rotation,
                              use_reentrant=False)
        return self.residual(x, layout, None, None, rotation)

    def residual(self, x: Tensor, layout: SequenceLayout, cache: LayerKVCache | None = None,
                 positions: Tensor | None = None, rotation: Rotation | None = None) -> Tensor:
        h = self.attn_norm(x)
        if self.shift:
            h = shift_tokens(h, layout, cache.shift.attn if cache is not None else None,
                             positions)
        out = self.attn(h, layout, cache, positions, rotation)
        x = x + (self.attn_scale(out) if self.attn_scale is not None else out)
        h = self.ff_norm(x)
        if self.shift:
            h = shift_tokens(h, layout, cache.shift.ff if cache is not None else None,
                             positions)
        out = self.ff(h)
        return x + (self.ff_scale(out) if self.ff_scale is not None else out)


def share_modules(blocks: Sequence[Block], attribute: str, ids: Sequence[str] | None) -> None:
    """DALLE-pytorch's --shared_attn_ids / --shared_ff_ids: every block whose id was seen
    before takes that block's module (`attribute`) instead of its own, so the layers hold
    one module object, one set of parameters (counted, saved and optimized once)."""
    if ids is None:
        return
    if len(ids) != len(blocks):
        raise ValueError(f"{len(ids)} shared ids for {len(blocks)} blocks")
    first: dict[str, nn.Module] = {}
    for block, key in zip(blocks, ids, strict=True):
        setattr(block, attribute, first.setdefault(key, getattr(block, attribute)))


class Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, ff_mult: int,
                 attn_dropout: float, ff_dropout: float, attn_types: tuple[str, ...],
                 options: PatternOptions | None = None, attn_impl: str = "auto",
                 stable: bool = False, rotary_emb: bool = False,
                 shift_tokens: bool = False, shared_attn_ids: Sequence[str] | None = None,
                 shared_ff_ids: Sequence[str] | None = None, layer_scale: bool = False,
                 rotate_values: bool = False) -> None:
        super().__init__()
        self.heads, self.dim_head, self.dim = heads, dim_head, dim
        self.stable = stable
        options = options or PatternOptions()
        # --rotary_emb: one rotation table for every layer (model/rotary.py); no parameters.
        self.rotary = RotaryEmbedding(dim_head) if rotary_emb else None
        self.blocks = nn.ModuleList(
            Block(dim, heads, dim_head, ff_mult, attn_dropout, ff_dropout,
                  attn_types[i % len(attn_types)], options, attn_impl, stable, shift_tokens,
                  i + 1 if layer_scale else None, rotate_values)
            for i in range(depth)
        )
        share_modules(self.blocks, "attn", shared_attn_ids)
        share_modules(self.blocks, "ff", shared_ff_ids)
        self.norm = nn.LayerNorm(dim)

    def set_checkpointing(self, enabled: bool) -> None:
        """--activation_checkpointing: every block recomputes its activations in backward."""
        for block in self.blocks:
            block.checkpointing = enabled

    def compile_training(self, compile_fn: Callable[[Callable[..., Tensor]],
                                                    Callable[..., Tensor]]) -> None:
        """train --compile: each block's training call compiled on its own
        (Block.compile_training), as torchtitan compiles per block: blocks alike share
        one graph, and nothing outside the blocks (embeddings, logits, loss) is traced."""
        for block in self.blocks:
            block.compile_training(compile_fn)

    def use_compiled(self, on: bool) -> None:
        """Whether compiled blocks run their compiled call (the default) or eager, as
        before compile_training (the training loop's first step: train/compile.py)."""
        for block in self.blocks:
            block.use_compiled = on

    def shard_groups(self) -> list[list[Block]]:
        """The blocks in sets that no shared module crosses, in layer order: a block that
        shares nothing is a set of its own; blocks linked by a shared attention or
        feed-forward module (directly or through others) form one set. FSDP shards each
        set as one unit, so a shared module is never split over two units."""
        owner: dict[int, int] = {}  # id(shared module) -> first block using it
        parent = list(range(len(self.blocks)))

        def root(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        for i, block in enumerate(self.blocks):
            for module in (block.attn, block.ff):
                first = owner.setdefault(id(module), i)
                parent[root(i)] = root(first)
        groups: dict[int, list[Block]] = {}
        for i, block in enumerate(self.blocks):
            groups.setdefault(root(i), []).append(block)
        return list(groups.values())

    def new_cache(self, batch: int, layout: SequenceLayout, device: torch.device,
                  dtype: torch.dtype) -> nn.ModuleList:
        """One preallocated LayerKVCache per block, each over the whole sequence (with the
        last grid row of each shift point under --shift_tokens)."""
        caches = nn.ModuleList()
        for block in self.blocks:
            cache = block.attn.new_cache(batch, layout, device, dtype)
            if block.shift:
                cache.shift = ShiftRows(batch, layout, self.dim, device, dtype)
            caches.append(cache)
        return caches

    def forward(self, x: Tensor, layout: SequenceLayout,
                cache: Sequence[LayerKVCache] | None = None,
                positions: Tensor | None = None) -> Tensor:
        """Without a cache x holds positions 0..n-1; with one, `positions` says where."""
        rotation = (self.rotary.at(layout, x.shape[1], x.device,
                                   positions if cache is not None else None)
                    if self.rotary is not None else None)
        for i, block in enumerate(self.blocks):
            x = block(x, layout, cache[i] if cache is not None else None, positions, rotation)
        if self.stable:
            # --stable_softmax: DALLE-pytorch divides the output by its (detached) maximum
            # before the final norm, which keeps a 16-bit stream in range
            x = x / x.amax(dim=-1, keepdim=True).detach()
        return self.norm(x)
