"""--flops_profiler counts what a hand count of the model gives, on a wrapped model too.

A DALL-E's FLOPs are its matmuls: the transformer's linear layers (2 x weights per token
forward, twice that backward: the input's and the weight's gradients), the attention's two
L x L products per head, and the output logits. The counts below are written from the
layer shapes, not from our code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dalle_dist.data.tokenizer import load_tokenizer
from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.train.flops import OWN, count_flops
from tests import launch
from tests.conftest import TINY_DALLE_FLAGS

# TINY_DALLE_FLAGS on tiny_vae (16 px, 2 layers: a 4 x 4 grid of 32 tokens)
DIM, DEPTH, HEADS, DIM_HEAD, TEXT, FMAP, IMAGE_TOKENS, FF_MULT = 32, 2, 2, 16, 40, 4, 32, 4


def hand_count(batch: int, vocab: int, fused: bool) -> dict[str, tuple[int, int]]:
    """(forward, backward) FLOPs by top-level module, from the layer shapes. fused: the
    attention ran in SDPA's fused kernel, whose backward recomputes q.k (5 products
    against the forward's 2; the einsum path keeps the scores: 4)."""
    length = TEXT + FMAP**2  # <bos> + text, then all image cells but the last
    tokens = batch * length
    inner = HEADS * DIM_HEAD
    block_weights = DIM * 3 * inner + inner * DIM + 3 * DIM * DIM * FF_MULT
    linear = 2 * tokens * block_weights
    product = 2 * batch * HEADS * length * length * DIM_HEAD  # one L x L x d product
    forward = DEPTH * (linear + 2 * product)  # q.k and attn.v
    backward = DEPTH * (2 * linear + (5 if fused else 4) * product)
    # the logits: text positions over the text vocabulary (+ one pad id per position),
    # image positions over the image tokens; F.linear in DALLE itself, not to_logits()
    logits = 2 * batch * DIM * (TEXT * (vocab + TEXT) + FMAP**2 * IMAGE_TOKENS)
    return {"transformer": (forward, backward), OWN: (logits, 2 * logits)}


def tiny_model(impl: str, vocab: int) -> DALLE:
    config = DALLEConfig(num_text_tokens=vocab, text_seq_len=TEXT,
                         num_image_tokens=IMAGE_TOKENS, image_fmap_size=FMAP, dim=DIM,
                         depth=DEPTH, heads=HEADS, dim_head=DIM_HEAD, ff_mult=FF_MULT)
    return DALLE(config, impl)


@pytest.mark.parametrize("impl", ["dense", "sdpa"])
def test_counted_flops_equal_the_hand_count(impl: str) -> None:
    """dense: attention as two einsums; sdpa: PyTorch's fused CPU kernel, which torch's
    counter does not know (broken once: without cpu_attention_formulas the sdpa count
    lacked the attention's 4 x B x H x L^2 x d per layer). Also broken once: the backward
    taken as the whole count (no forward snapshot): every backward row was 3x."""
    torch.manual_seed(0)
    batch, vocab = 3, 300
    model = tiny_model(impl, vocab)
    text = torch.randint(1, vocab, (batch, TEXT))
    image = torch.randint(0, IMAGE_TOKENS, (batch, FMAP**2))
    flops = count_flops(model, lambda: model(text, image)["loss"], lambda loss: loss.backward())
    expected = hand_count(batch, vocab, fused=impl == "sdpa")
    for name, (forward, backward) in expected.items():
        assert (flops.forward[name], flops.backward[name]) == (forward, backward), name
    assert all(flops.of(name) == 0 for name in flops.forward if name not in expected)
    assert flops.total == sum(f + b for f, b in expected.values())


def test_profiler_on_two_fsdp_ranks(tmp_path: Path, tiny_vae: Path) -> None:
    """torchrun, 2 FSDP2 ranks (the wrapped, sharded model): exit 0, one table from the
    root, each rank's micro-batch counted as the hand count says, nothing written.
    Broken once: module names looked up as DALLE.<child> (the bare model's): under
    FSDP2 (FSDPDALLE.transformer) every row fell into OWN and the transformer showed 0."""
    out = tmp_path / "out"
    result = launch.torchrun(
        "train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--epochs", "1",
        "--batch_size", "16", "--shapes_count", "64", "--fidelity_images", "0",
        "--distributed_backend", "fsdp", "--flops_profiler",
        "--dalle_output_file_name", str(out / "dalle"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-4000:]
    assert text.count("--flops_profiler: FLOPs of one forward and backward of 8 sample(s) "
                      "per rank") == 1, text[-4000:]
    counted = int(re.search(r"\((\d+) FLOP per micro-batch\) per rank x 2 ranks", text)[1])
    expected = hand_count(8, load_tokenizer(None).vocab_size, fused=True)  # auto: sdpa
    assert counted == sum(f + b for f, b in expected.values())
    transformer = re.search(r"^\S*transformer\s+.*?(\d+\.\d)%$", text, re.MULTILINE)
    assert transformer and float(transformer[1]) > 50, text[-4000:]
    assert re.search(r"MFU \d+\.\d\d%", text)
    assert not out.exists(), sorted(out.rglob("*"))
