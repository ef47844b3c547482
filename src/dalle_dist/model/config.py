"""Typed model configurations. A checkpoint stores them as plain dicts (`asdict`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dalle_dist.config_base import DictConfig, comma_list, option
from dalle_dist.errors import ConfigError
from dalle_dist.model.attention import ATTN_IMPLS
from dalle_dist.model.patterns import PATTERNS
from dalle_dist.model.rotary import rotated_features
from dalle_dist.model.shift import check_shift_dim


@dataclass(frozen=True)
class VAEConfig(DictConfig):
    """Discrete VAE shape. Defaults suit the built-in 32x32 shapes on a CPU."""

    image_size: int = option(32, "side of the square images in pixels")
    num_tokens: int = option(128, "codebook size")
    codebook_dim: int = option(64, "codebook dimension", name="--emb_dim")
    num_layers: int = option(2, "downsampling layers: tokens = (image_size / 2^num_layers)^2")
    num_resnet_blocks: int = option(
        1, "residual blocks after the encoder's downsampling and before the decoder's "
        "upsampling")
    hidden_dim: int = option(64, "channels of the encoder's and decoder's convolutions")
    channels: int = option(
        3, "image channels: 3 (RGB) or 4 (RGBA: alpha goes through the VAE, and through a "
        "DALL-E trained on it, and is kept in the PNGs written)", choices=(3, 4),
        shortcuts=(("--transparent", 4),))
    smooth_l1_loss: bool = option(False, "reconstruction loss smooth L1 instead of MSE")
    kl_loss_weight: float = option(
        0.0, "weight of the KL divergence between the codebook choice and a uniform prior, "
        "added to the reconstruction loss")
    straight_through: bool = option(
        False, "hard Gumbel-softmax samples with straight-through gradients")
    #: A 1x1 convolution from the codebook to --hidden_dim channels opens the decoder.
    #: DALLE-pytorch's DiscreteVAE has it only with resnet blocks; without them its first
    #: transposed convolution reads the codebook directly. Not a flag: `checkpoint import`
    #: sets it for such a VAE (docs/from-dalle-pytorch.md).
    decoder_stem: bool = True

    @property
    def fmap_size(self) -> int:
        """Side of the token map: each encoder layer halves the image."""
        return self.image_size // 2**self.num_layers

    def validate(self) -> None:
        for name in ("image_size", "num_tokens", "codebook_dim", "num_layers", "hidden_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.num_resnet_blocks < 0:
            raise ConfigError("--num_resnet_blocks must be >= 0")
        if self.channels not in (3, 4):
            raise ConfigError(f"--channels must be 3 (RGB) or 4 (RGBA, --transparent), got "
                              f"{self.channels}")
        if self.num_resnet_blocks and not self.decoder_stem:
            raise ConfigError("a VAE without a decoder stem cannot have resnet blocks (its "
                              "blocks run on --hidden_dim channels)")
        if self.kl_loss_weight < 0:
            raise ConfigError("--kl_loss_weight must be >= 0")
        factor = 2**self.num_layers
        if self.image_size % factor:
            lower = self.image_size // factor * factor
            examples = " or ".join(str(s) for s in (lower, lower + factor) if s > 0)
            raise ConfigError(
                f"--image_size {self.image_size} cannot be downsampled evenly by "
                f"--num_layers {self.num_layers} (factor {factor})",
                f"use an image size divisible by {factor}, e.g. {examples}",
            )


@dataclass(frozen=True, kw_only=True)
class DALLEConfig(DictConfig):
    """Transformer over [<bos>, text tokens, image tokens].

    num_text_tokens is the tokenizer's vocabulary (id 0 = padding); the model adds
    text_seq_len more ids so each padding position gets its own token, as DALLE-pytorch does.
    num_image_tokens and image_fmap_size come from the VAE. The defaults are `train`'s:
    sized for the built-in shapes on a CPU (DALLE-pytorch's dim 512 targets GPUs).
    """

    num_text_tokens: int
    text_seq_len: int = option(
        48, "caption tokens, bytes with the default tokenizer")
    num_image_tokens: int
    image_fmap_size: int
    dim: int = option(128, "model width: embedding and residual-stream features")
    depth: int = option(4, "transformer layers")
    heads: int = option(4, "attention heads per layer")
    dim_head: int = option(32, "features per attention head")
    ff_mult: int = option(4, "feed-forward hidden width as a multiple of --dim")
    attn_dropout: float = option(0.0, "dropout rate on the attention weights")
    ff_dropout: float = option(0.0, "dropout rate inside the feed-forward blocks")
    attn_types: tuple[str, ...] = option(
        ("full",), "comma list of attention patterns cycled over layers: "
        + ", ".join(PATTERNS), parse=comma_list)
    loss_img_weight: float = option(
        7.0, "weight W of the image tokens' loss: loss = (text loss + W x image loss) / (W + 1)")
    conv_kernel_size: int = option(
        5, "conv_like window side, odd: an image token sees the k x k cells (dilated) "
        "that end at it, up and to the left, as in DALLE-pytorch")
    conv_dilation: int = option(1, "conv_like window dilation")
    sparse_random_blocks: int | None = option(
        None, "sparse: random 16-token blocks per block",
        default_text="default: a quarter of the sequence's blocks, as DALLE-pytorch")
    sparse_seed: int = option(0, "seed of the sparse layout's random blocks")
    null_cond_prob: float = option(
        0.0, "classifier-free guidance training: replace a caption with the null caption (all "
        "padding) at this rate per sample, so that generate --cond_scale can guide; the "
        "checkpoint records it")
    stable_softmax: bool = option(
        False, "DALLE-pytorch's stable mode: the transformer's output divided by its max "
        "before the final norm, the embeddings' gradient scaled by 0.1, and a stabler "
        "softmax in the dense and band paths")
    rotary_emb: bool = option(
        False, "rotary position embeddings (DALLE-pytorch's): 1-D over the text, axial "
        "(row, column) over the image, on every layer's queries and keys; replaces the "
        "learned position embeddings. Needs --dim_head >= 6")
    shift_tokens: bool = option(
        False, "DALLE-pytorch's token shift: before attention and feed-forward, half of a "
        "text position's features come from the previous token, a quarter of an image "
        "cell's from the cell above and a quarter from the cell to its left")
    # -- sharing (DALLE-pytorch's --shared_attn_ids / --shared_ff_ids / --share_input_output_emb)
    shared_attn_ids: tuple[str, ...] | None = option(
        None, "comma list, one id per layer: layers with the same id share one attention "
        "module (and must have the same attention pattern)", parse=comma_list,
        default_text="default: no sharing")
    shared_ff_ids: tuple[str, ...] | None = option(
        None, "comma list, one id per layer: layers with the same id share one feed-forward "
        "module", parse=comma_list, default_text="default: no sharing")
    share_input_output_emb: bool = option(
        False, "tie the text and image token embeddings to the rows of the output "
        "projection that predict those tokens, as DALLE-pytorch does")
    # -- DALLE-pytorch 1.x's own architecture, for an imported model (not flags: `checkpoint
    # import` sets them from the file; docs/from-dalle-pytorch.md)
    #: LayerScale: every attention and feed-forward output is multiplied by a learned
    #: per-channel vector of its layer (not shared with --shared_*_ids)
    layer_scale: bool = False
    #: --rotary_emb rotates the values too, not only queries and keys
    rotate_values: bool = False

    def __post_init__(self) -> None:
        # A checkpoint stores attn_types as a list; keep the dataclass hashable and comparable.
        object.__setattr__(self, "attn_types", tuple(self.attn_types))
        for name in ("shared_attn_ids", "shared_ff_ids"):
            ids = getattr(self, name)
            if ids is not None:
                object.__setattr__(self, name, tuple(str(i) for i in ids))

    @property
    def image_seq_len(self) -> int:
        return self.image_fmap_size**2

    def validate(self) -> None:
        for name in ("dim", "depth", "heads", "dim_head", "ff_mult", "text_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        for name in ("attn_dropout", "ff_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.null_cond_prob < 1.0:
            raise ConfigError(f"--null_cond_prob must be in [0, 1), got {self.null_cond_prob}",
                              "DALLE-pytorch's classifier-free guidance papers use about 0.1")
        if self.loss_img_weight < 0:
            raise ConfigError("--loss_img_weight must be >= 0")
        if not self.attn_types:
            raise ConfigError("--attn_types is empty", "give at least one pattern, e.g. full")
        if self.rotary_emb and rotated_features(self.dim_head) == 0:
            raise ConfigError(f"--rotary_emb needs --dim_head >= 6 (three bands of feature "
                              f"pairs), got {self.dim_head}",
                              "raise --dim_head or drop --rotary_emb")
        if self.rotate_values and not self.rotary_emb:
            raise ConfigError("rotate_values needs rotary_emb")
        if self.shift_tokens:
            check_shift_dim(self.dim)
        check_shared_ids(self.depth, self.attn_types, self.shared_attn_ids,
                         self.shared_ff_ids)


def check_shared_ids(depth: int, attn_types: Sequence[str],
                     shared_attn_ids: Sequence[str] | None,
                     shared_ff_ids: Sequence[str] | None) -> None:
    """One id per layer (DALLE-pytorch cycled a shorter list; a miscount here is far more
    often a typo than a wish to repeat), and layers sharing an attention module run the
    same pattern: one module cannot compute two patterns."""
    for flag, ids in (("--shared_attn_ids", shared_attn_ids),
                      ("--shared_ff_ids", shared_ff_ids)):
        if ids is not None and len(ids) != depth:
            raise ConfigError(
                f"{flag} gives {len(ids)} ids for --depth {depth} layers",
                f"give one id per layer, e.g. {flag} {','.join(str(i // 2) for i in range(depth))}")
    if shared_attn_ids is None or not attn_types:
        return
    first: dict[str, int] = {}
    for layer, key in enumerate(shared_attn_ids):
        other = first.setdefault(key, layer)
        a, b = attn_types[other % len(attn_types)], attn_types[layer % len(attn_types)]
        if a != b:
            raise ConfigError(
                f"--shared_attn_ids: layers {other} and {layer} share attention id {key!r} "
                f"but --attn_types gives them {a} and {b}",
                "share attention only between layers of the same pattern")


#: train --compile_backend: inductor (fused kernels; the default) or aot_eager (forward and
#: backward traced as for inductor, torch's own kernels run: tells a compiler bug from a
#: tracing one). The first is the default.
COMPILE_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager")


@dataclass(frozen=True)
class ComputeConfig(DictConfig):
    """How the model computes, not what it is: free to change when a run resumes."""

    attn_impl: str = option("auto", "how attention is computed: auto picks the fastest "
                            "correct path for the device", choices=ATTN_IMPLS)
    no_tf32: bool = option(
        False, "keep fp32 matmuls and convolutions in full fp32 on CUDA; by default they "
        "run in TensorFloat-32 (10-bit mantissa, several times faster on Ampere and "
        "later). No effect on CPU, or on what autocast runs in bf16/fp16")
    activation_checkpointing: bool = option(
        False, "recompute each transformer block's activations in backward instead of "
        "keeping them (torch.utils.checkpoint, non-reentrant): less memory, about a third "
        "more compute. --reversible is DALLE-pytorch's spelling; it maps to this",
        aliases=("--reversible",))
    compile: bool = option(
        False, "torch.compile each transformer block's training step (fullgraph, one graph "
        "per kind of block, compiled in the second step; the first step, sampling and "
        "validation stay eager). Every backend (under ZeRO-3 each block is a leaf module, "
        "gathered whole); the log gives the compile time")
    compile_backend: str | None = option(
        None, "the torch.compile backend of --compile", choices=COMPILE_BACKENDS,
        default_text=f"default: {COMPILE_BACKENDS[0]}")

    def validate(self) -> None:
        if self.compile_backend is not None and not self.compile:
            raise ConfigError(f"--compile_backend {self.compile_backend} without --compile",
                              "add --compile, or drop --compile_backend")
