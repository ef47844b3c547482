"""The layout of DALLE-pytorch 1.x's files that both directions share: the release they
are tested against, where each DiscreteVAE weight sits in its state dict, and the rotary
angles table its DALLE keeps as a buffer.

(checkpoint/dalle_pytorch.py imports its files, checkpoint/dalle_pytorch_export.py writes
them; docs/from-dalle-pytorch.md.)
"""

from __future__ import annotations

import torch

from dalle_dist.model.config import DALLEConfig, VAEConfig

#: the DALLE-pytorch release whose files and code the import and export are tested against
REFERENCE_VERSION = "1.6.6"
#: the key under which an export keeps our tokenizer (DALLE-pytorch ignores other keys)
TOKENIZER_KEY = "dalle_dist_tokenizer"


def their_vae_keys(config: VAEConfig) -> list[tuple[str, str]]:
    """(their key, our key) for every DiscreteVAE weight, in their state dict's order."""
    layers, blocks = config.num_layers, config.num_resnet_blocks
    pairs = [("codebook.weight", "codebook.weight")]

    def conv(theirs: str, ours: str) -> None:
        pairs.extend((f"{theirs}.{p}", f"{ours}.{p}") for p in ("weight", "bias"))

    def resblock(theirs: str, ours: str) -> None:
        for i in (0, 2, 4):
            conv(f"{theirs}.net.{i}", f"{ours}.net.{i}")

    for i in range(layers):  # ours: conv, ReLU pairs flat; theirs: Sequential(conv, ReLU)
        conv(f"encoder.{i}.0", f"encoder.{2 * i}")
    for j in range(blocks):
        resblock(f"encoder.{layers + j}", f"encoder.{2 * layers + j}")
    conv(f"encoder.{layers + blocks}", f"encoder.{2 * layers + blocks}")
    stem = 1 if config.decoder_stem else 0
    if stem:
        conv("decoder.0", "decoder.0")
    for j in range(blocks):
        resblock(f"decoder.{stem + j}", f"decoder.{stem + j}")
    for i in range(layers):
        conv(f"decoder.{stem + blocks + i}.0", f"decoder.{stem + blocks + 2 * i}")
    conv(f"decoder.{stem + blocks + layers}", f"decoder.{stem + blocks + 2 * layers}")
    return pairs


def rotary_table(config: DALLEConfig) -> torch.Tensor:
    """Our rotary angles for `config`'s layout, [text_len + image_len, rotated features]
    fp32: what 1.6.6's `transformer.pos_emb` buffer holds (less its leading 1)."""
    from dalle_dist.model.patterns import SequenceLayout
    from dalle_dist.model.rotary import rotary_angles

    layout = SequenceLayout(text_len=config.text_seq_len + 1, fmap_size=config.image_fmap_size)
    return rotary_angles(layout, config.dim_head)
