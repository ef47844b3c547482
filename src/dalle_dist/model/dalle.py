"""DALLE: an autoregressive transformer over text tokens followed by image tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dalle_dist.model.attention import LayerKVCache
from dalle_dist.model.config import DALLEConfig
from dalle_dist.model.decoding import StaticDecoder
from dalle_dist.model.image_tokenizer import ImageTokenizer
from dalle_dist.model.init import initial_value
from dalle_dist.model.modes import eval_mode
from dalle_dist.model.patterns import PatternOptions, SequenceLayout
from dalle_dist.model.sampling import guide, null_text, sample_tokens
from dalle_dist.model.transformer import LayerScale, Transformer


class TiedEmbedding(nn.Module):
    """--share_input_output_emb: token embeddings read from rows [start, end) of the output
    projection's weight, the rows whose logits predict those tokens (DALLE-pytorch's
    SharedEmbedding). It owns no parameter: the projection is held outside the module
    tree (a plain list), so the weight has one name (`to_logits.weight`), one gradient
    and one optimizer state, and the module is read at call time, after any backend
    has replaced or gathered its parameter."""

    def __init__(self, linear: nn.Linear, start: int, end: int) -> None:
        super().__init__()
        self._linear = [linear]  # a list: not registered as a submodule
        self.start, self.end = start, end

    @property
    def weight(self) -> Tensor:
        """The embedding table: a view of the projection's rows."""
        return self._linear[0].weight[self.start : self.end]

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight)


class DALLE(nn.Module):
    """Text positions predict text tokens, image positions predict image tokens.

    Padding: every padding slot i of the caption becomes its own token
    (num_text_tokens + i), as in DALLE-pytorch, so the model always sees a full-length,
    position-unique text and no attention mask is needed for padding. <bos> is id 0,
    which no caption token can take after that substitution.

    One output projection covers both vocabularies; each position multiplies only the
    rows of its own vocabulary, which is the "restricted logits" of DALLE-pytorch
    without computing and masking the other part.
    """

    #: Methods other than forward that read the root module's own weights (embeddings,
    #: logits): sampling's entry points. A sharding wrapper gathers those weights around
    #: them as it does around forward (FSDP2's register_fsdp_forward_method); the blocks
    #: are reached through their own calls and gather themselves.
    forward_methods: ClassVar[tuple[str, ...]] = ("prefill", "decode_step",
                                                  "uncached_image_logits")

    def __init__(self, config: DALLEConfig, attn_impl: str = "auto") -> None:
        super().__init__()
        config.validate()
        self.config = config
        c = config
        self.text_vocab = c.num_text_tokens + c.text_seq_len
        self.layout = SequenceLayout(text_len=c.text_seq_len + 1, fmap_size=c.image_fmap_size)

        self.text_emb = nn.Embedding(self.text_vocab, c.dim)
        self.image_emb = nn.Embedding(c.num_image_tokens, c.dim)
        # Learned positions, unless --rotary_emb gives them to every layer's q and k
        # instead (as in DALLE-pytorch): text positions, image row + column (axial).
        self.text_pos_emb: nn.Embedding | None = None
        self.image_row_emb: nn.Embedding | None = None
        self.image_col_emb: nn.Embedding | None = None
        if not c.rotary_emb:
            self.text_pos_emb = nn.Embedding(c.text_seq_len + 1, c.dim)
            self.image_row_emb = nn.Embedding(c.image_fmap_size, c.dim)
            self.image_col_emb = nn.Embedding(c.image_fmap_size, c.dim)
        options = PatternOptions(c.conv_kernel_size, c.conv_dilation, c.sparse_random_blocks,
                                 c.sparse_seed)
        self.transformer = Transformer(c.dim, c.depth, c.heads, c.dim_head, c.ff_mult,
                                       c.attn_dropout, c.ff_dropout, c.attn_types, options,
                                       attn_impl, c.stable_softmax, c.rotary_emb,
                                       c.shift_tokens, c.shared_attn_ids, c.shared_ff_ids,
                                       c.layer_scale, c.rotate_values)
        self.to_logits = nn.Linear(c.dim, self.text_vocab + c.num_image_tokens)
        if c.share_input_output_emb:
            self.text_emb = TiedEmbedding(self.to_logits, 0, self.text_vocab)
            self.image_emb = TiedEmbedding(self.to_logits, self.text_vocab,
                                           self.text_vocab + c.num_image_tokens)
        self.apply(self._init_weights)

    @staticmethod
    @torch.no_grad()
    def _init_weights(module: nn.Module) -> None:
        """model/init.py's rule, drawn from the global RNG: a model built directly. A
        training run builds on the meta device and draws from --seed's own stream
        (model.init.initial_weights), the same on every backend and world size.
        LayerNorm sets its own values; LayerScale's vector is allocated empty, so it is
        filled here too (it held whatever the memory held: NaN gradients)."""
        if isinstance(module, (nn.Linear, nn.Embedding, LayerScale)):
            for name, param in module.named_parameters(recurse=False):
                if not param.is_meta:  # built on the meta device: nothing to fill
                    param.copy_(initial_value(module, name, param.shape))

    # -- embedding -------------------------------------------------------------------

    def _text_input(self, text: Tensor) -> Tensor:
        """[b, text_seq_len] (0 = padding) -> [b, text_seq_len + 1] with <bos> and unique pads."""
        c = self.config
        if text.shape[1] != c.text_seq_len:
            raise ValueError(f"text has length {text.shape[1]}, model expects {c.text_seq_len}")
        pads = torch.arange(c.text_seq_len, device=text.device) + c.num_text_tokens
        text = torch.where(text == 0, pads, text)
        return F.pad(text, (1, 0), value=0)

    def _embed_text(self, text_in: Tensor) -> Tensor:
        if self.text_pos_emb is None:
            return self.text_emb(text_in)
        positions = torch.arange(text_in.shape[1], device=text_in.device)
        return self.text_emb(text_in) + self.text_pos_emb(positions)

    def _embed_image(self, tokens: Tensor, cells: Tensor | None = None) -> Tensor:
        """Image tokens [b, n] at grid `cells` [n] (row-major; default 0..n-1)."""
        if self.image_row_emb is None or self.image_col_emb is None:
            return self.image_emb(tokens)
        if cells is None:
            cells = torch.arange(tokens.shape[1], device=tokens.device)
        side = self.config.image_fmap_size
        return (self.image_emb(tokens) + self.image_row_emb(cells // side)
                + self.image_col_emb(cells % side))

    def _text_logits(self, h: Tensor) -> Tensor:
        w, b = self.to_logits.weight, self.to_logits.bias
        return F.linear(h, w[: self.text_vocab], b[: self.text_vocab])

    def _image_logits(self, h: Tensor) -> Tensor:
        w, b = self.to_logits.weight, self.to_logits.bias
        return F.linear(h, w[self.text_vocab :], b[self.text_vocab :])

    # -- training --------------------------------------------------------------------

    def forward(self, text: Tensor, image_tokens: Tensor) -> dict[str, Tensor]:
        """Loss on [b, text_seq_len] captions and [b, fmap^2] image token ids.

        loss = (text_loss + loss_img_weight * image_loss) / (loss_img_weight + 1)
        """
        text_in = self._text_input(text)
        x = torch.cat((self._embed_text(text_in), self._embed_image(image_tokens[:, :-1])), dim=1)
        if self.config.stable_softmax:
            # DALLE-pytorch's stable training: the embeddings' gradient scaled by 0.1
            x = x * 0.1 + x.detach() * 0.9
        h = self.transformer(x, self.layout)
        n_text = self.layout.text_len - 1  # positions that predict the next text token
        text_logits = self._text_logits(h[:, :n_text])
        image_logits = self._image_logits(h[:, n_text:])
        text_loss = F.cross_entropy(text_logits.flatten(0, 1), text_in[:, 1:].flatten())
        image_loss = F.cross_entropy(image_logits.flatten(0, 1), image_tokens.flatten())
        w = self.config.loss_img_weight
        loss = (text_loss + w * image_loss) / (w + 1)
        return {"loss": loss, "text_loss": text_loss.detach(), "image_loss": image_loss.detach()}

    # -- sampling --------------------------------------------------------------------

    def prefill(self, text: Tensor, cache: Sequence[LayerKVCache]) -> Tensor:
        """Encode [b, text_seq_len] captions into `cache` (positions 0..text_len-1);
        returns the image logits [b, vocab] of the first image cell."""
        x = self._embed_text(self._text_input(text))
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.transformer(x, self.layout, cache, positions)
        return self._image_logits(h[:, -1])

    def decode_step(self, tokens: Tensor, cell: Tensor, cache: Sequence[LayerKVCache]) -> Tensor:
        """Feed image tokens [b, 1] at grid `cell` ([1], a tensor: one compiled step serves
        every cell); returns the image logits [b, vocab] of the next cell."""
        h = self.transformer(self._embed_image(tokens, cell), self.layout, cache,
                             cell + self.layout.text_len)
        return self._image_logits(h[:, -1])

    @torch.no_grad()
    def sample_image_tokens(
        self,
        text: Tensor,
        filter_thres: float = 0.5,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        decoder: StaticDecoder | None = None,
        cond_scale: float = 1.0,
    ) -> Tensor:
        """Sample [b, fmap^2] image token ids for [b, text_seq_len] captions.

        With use_cache the prefix is encoded once into a preallocated cache and each new
        token costs one position (decoding.StaticDecoder; pass `decoder` to reuse one, e.g.
        a compiled one, across calls; its own cond_scale then applies). Without it every
        step re-runs the whole sequence: the reference the cache must match token for token.
        cond_scale: classifier-free guidance, null + (cond - null) x cond_scale (1: none);
        uncached, the conditional and null passes are two separate forwards.
        """
        if use_cache:
            if decoder is None:
                decoder = StaticDecoder(self, text.shape[0], cond_scale=cond_scale)
            if decoder.model is not self:
                raise ValueError("the decoder was built for another model")
            return decoder.sample(text, filter_thres, temperature, generator)
        with eval_mode(self):
            n_image = self.layout.image_len
            tokens = torch.empty(text.shape[0], n_image, dtype=torch.long, device=text.device)
            for j in range(n_image):
                logits = self.uncached_image_logits(text, tokens[:, :j])
                if cond_scale != 1.0:
                    null = self.uncached_image_logits(null_text(text), tokens[:, :j])
                    logits = guide(logits, null, cond_scale)
                tokens[:, j] = sample_tokens(logits, filter_thres, temperature, generator)
            return tokens

    def uncached_image_logits(self, text: Tensor, tokens: Tensor) -> Tensor:
        """The image logits [b, vocab] of the cell after image tokens [b, j] (j may be 0),
        from one forward over the whole sequence: no cache, the reference for decoding."""
        x = self._embed_text(self._text_input(text))
        if tokens.shape[1]:
            x = torch.cat((x, self._embed_image(tokens)), dim=1)
        return self._image_logits(self.transformer(x, self.layout)[:, -1])

    @torch.no_grad()
    def complete_text(self, prompt: Tensor, filter_thres: float = 0.5, temperature: float = 1.0,
                      generator: torch.Generator | None = None) -> Tensor:
        """Continue [b, k] caption ids (no padding, k <= text_seq_len) to text_seq_len ids by
        sampling the model's own text predictions one position at a time, as
        DALLE-pytorch's generate_texts does (--gentxt).

        Returns [b, text_seq_len] ids of the model's text vocabulary, where a sampled
        padding slot is num_text_tokens + i; `caption_ids` turns them into a caption.
        Every step runs the whole text (text_len positions, so every attention path sees
        the shape it trains on): positions not yet sampled hold their padding slot, and
        causal text attention keeps them from the position read.
        """
        c = self.config
        b, k = prompt.shape
        if k > c.text_seq_len:
            raise ValueError(f"prompt has {k} tokens, the model takes {c.text_seq_len}")
        with eval_mode(self):
            seq = self._text_input(torch.zeros(b, c.text_seq_len, dtype=torch.long,
                                               device=prompt.device))
            seq[:, 1:k + 1] = prompt
            for pos in range(k, c.text_seq_len):
                h = self.transformer(self._embed_text(seq), self.layout)
                seq[:, pos + 1] = sample_tokens(self._text_logits(h[:, pos]), filter_thres,
                                                temperature, generator)
            return seq[:, 1:]

    def caption_ids(self, ids: Tensor) -> Tensor:
        """Model text ids [b, text_seq_len] -> caption ids with 0 for padding: <bos> and
        the padding slots (wherever they were sampled) are dropped and the rest moves left,
        so the caption decoded from them, once tokenized, gives these ids again."""
        keep = (ids > 0) & (ids < self.config.num_text_tokens)
        out = torch.zeros_like(ids)
        for row in range(ids.shape[0]):
            kept = ids[row][keep[row]]
            out[row, : kept.numel()] = kept
        return out

    @torch.no_grad()
    def generate_images(
        self,
        text: Tensor,
        vae: ImageTokenizer,
        filter_thres: float = 0.5,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        decoder: StaticDecoder | None = None,
        cond_scale: float = 1.0,
    ) -> Tensor:
        """Captions -> [b, C, H, W] images in [0, 1], decoded by the model's own VAE (C: its
        channels, 4 for a --transparent one). cond_scale: classifier-free guidance
        (DALLE-pytorch's generate_images argument)."""
        tokens = self.sample_image_tokens(text, filter_thres, temperature, generator,
                                          decoder=decoder, cond_scale=cond_scale)
        return vae.decode(tokens)
