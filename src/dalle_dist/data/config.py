"""Where the training data comes from."""

from __future__ import annotations

from dataclasses import dataclass

from dalle_dist.config_base import DictConfig, option


@dataclass(frozen=True)
class DataConfig(DictConfig):
    """image_text_folder None means the built-in shapes dataset."""

    image_text_folder: str | None = option(
        None, "folder of name.png + name.txt pairs", default_text="default: built-in shapes")
    wds: str | None = option(
        None, "the folder (or brace pattern) holds WebDataset .tar shards; name the image and "
        "caption member extensions, e.g. jpg,txt", metavar="IMG,CAP",
        default_text="default: a plain folder")
    token_shards: str | None = option(
        None, "train from the token shards `dalle-dist encode` wrote into this folder: no "
        "image is decoded and the encoder never runs; the VAE or VQGAN must be the one that "
        "encoded them (checked by content hash)", metavar="DIR",
        default_text="default: encode images while training")
    image_size: int = 32  # the VAE's (train-vae's --image_size, or the VAE DALL-E trains on)
    #: the VAE's too: 4 (--transparent) loads RGBA, alpha kept, opaque images get alpha 1
    channels: int = 3
    truncate_captions: bool = option(
        False, "cut captions longer than --text_seq_len instead of stopping")
    resize_ratio: float = option(
        0.75, "random square crops keep at least this fraction of the area",
        name="--random_resize_crop_lower_ratio")
    shapes_count: int = option(10_000, "images per epoch of the built-in shapes")
    shapes_seed: int = option(0, "seed of the built-in shapes")
    num_workers: int | None = option(
        None, "data loader processes per rank (0: load in the training process)",
        default_text="default: on CUDA min(8, CPUs per local rank - 1), on CPU 0, since "
        "there the step's threads already use every core")

    @property
    def builtin(self) -> bool:
        return self.image_text_folder is None and self.token_shards is None



@dataclass(frozen=True)
class TokenizerConfig(DictConfig):
    """Which tokenizer turns captions into ids. Apart from DataConfig, whose dict keys the
    built-in VAE's cache key and every checkpoint's data record are made of.

    The flags keep DALLE-pytorch's meanings: --bpe_path alone is a YouTokenToMe model,
    with --hug a HuggingFace tokenizers JSON; --chinese needs no file (see CJKTokenizer).
    """

    bpe_path: str | None = option(
        None, "tokenizer file: a YouTokenToMe BPE model (DALLE-pytorch's meaning), CLIP's "
        "merges file bpe_simple_vocab_16e6.txt[.gz] (DALLE-pytorch's default tokenizer), or "
        "with --hug a HuggingFace tokenizers JSON", default_text="default: byte-level")
    hug: bool = option(False, "--bpe_path is a HuggingFace tokenizers JSON")
    chinese: bool = option(
        False, "captions in Chinese: one token per CJK character, UTF-8 bytes for the rest, "
        "offline (DALLE-pytorch downloads bert-base-chinese instead; to use its vocabulary "
        "pass --hug --bpe_path with its tokenizer.json)")

    @property
    def given(self) -> bool:
        """Whether any tokenizer flag was set (default: byte-level)."""
        return bool(self.bpe_path or self.hug or self.chinese)

    def describe(self) -> str:
        """The flags as typed, for messages."""
        parts = [f"--bpe_path {self.bpe_path}"] if self.bpe_path else []
        parts += ["--hug"] if self.hug else []
        parts += ["--chinese"] if self.chinese else []
        return " ".join(parts) or "the default byte-level tokenizer"
