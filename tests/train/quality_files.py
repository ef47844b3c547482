"""Small stand-ins for the files `train --fid_weights` and `--clip_dir` read, built here:
the real ones (95 MB of Inception, 600 MB of CLIP) cannot be downloaded in a test.

Each is the real format, read by the real loader: a TorchScript feature extractor, and a
Hugging Face CLIP directory saved by transformers (a random model with a byte-level
vocabulary, the 512 byte tokens of CLIP's BPE and no merges).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

EVAL_IMAGES = 8


class TinyFeatures(nn.Module):
    """uint8 images -> 15 features: the mean colour of each quarter, and each channel's
    spread. Any image size."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float() / 255
        return torch.cat([F.adaptive_avg_pool2d(x, 2).flatten(1),
                          x.flatten(2).std(dim=2)], 1)


def tiny_extractor(path: Path) -> Path:
    torch.jit.script(TinyFeatures()).save(str(path))
    return path


def tiny_clip(folder: Path) -> Path:
    """A random 1-layer CLIP (32 px images, 16-d embeddings), its tokenizer and its image
    processor's settings, saved as `CLIPModel.from_pretrained` reads them. The tokenizer
    splits words into CLIP's byte tokens (the last one ending the word), with CLIP's start
    and end markers: two captions differ in their ids wherever their words do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPModel, PreTrainedTokenizerFast

    from dalle_dist.data.clip_bpe import _byte_alphabet

    folder.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_alphabet()
    start, end = "<|startoftext|>", "<|endoftext|>"
    tokens = [*alphabet, *(c + "</w>" for c in alphabet), start, end]
    vocab = {token: i for i, token in enumerate(tokens)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=end,
                               end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{start} $A {end}", special_tokens=[(start, vocab[start]), (end, vocab[end])])
    bpe.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=start, eos_token=end,
                            pad_token=end, unk_token=end).save_pretrained(folder)
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 2,
                     "max_position_embeddings": 77, "bos_token_id": vocab[start],
                     "eos_token_id": vocab[end], "pad_token_id": vocab[end]},
        vision_config={"image_size": 32, "patch_size": 8, "hidden_size": 32,
                       "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2},
        projection_dim=16)
    # A seed whose image and caption embeddings agree in direction on average: from
    # most, the score of shapes and their captions is below 0, which CLIP score floors
    # to 0, and no pairing of images with captions could be told apart (the quality
    # test checks that the score it reads is above 0).
    torch.manual_seed(6)
    CLIPModel(config).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]}))
    return folder


def eval_flags(files: Path) -> tuple[str, ...]:
    """An evaluation at steps 2, 4 and 5 (the last) of the `trained` runs."""
    return ("--eval_every_n_steps", "2", "--eval_images", str(EVAL_IMAGES),
            "--fid_weights", str(files / "tiny.pt"), "--clip_dir", str(files / "clip"))
