"""generate() on checkpoints written here from tiny random models: --gentxt draws the images
from the caption the model completed, a --transparent VAE's alpha reaches the PNGs, and the
tokenizer flags agree with the checkpoint's or stop before anything is written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from dalle_dist.checkpoint.format import checkpoint_meta, write_checkpoint_file
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.tokenizer import ByteTokenizer, CJKTokenizer, Tokenizer, tokenize
from dalle_dist.errors import CheckpointError, ConfigError
from dalle_dist.generate import GenerateConfig, generate, prompt_dir_name
from dalle_dist.model import DALLE, DALLEConfig, DiscreteVAE, VAEConfig

CPU = torch.device("cpu")


def tiny_parts(channels: int = 3, tokenizer: Tokenizer | None = None
               ) -> tuple[DALLE, DiscreteVAE, Tokenizer]:
    torch.manual_seed(0)
    tokenizer = tokenizer or ByteTokenizer()
    vae = DiscreteVAE(VAEConfig(image_size=8, num_tokens=16, codebook_dim=8, num_layers=1,
                                num_resnet_blocks=0, hidden_dim=8, channels=channels)).eval()
    model = DALLE(DALLEConfig(num_text_tokens=tokenizer.vocab_size, text_seq_len=12,
                              num_image_tokens=16, image_fmap_size=4, dim=32, depth=2,
                              heads=2, dim_head=16)).eval()
    with torch.no_grad():
        model.to_logits.weight.mul_(50)  # predictions that differ with the text
    return model, vae, tokenizer


def write_dalle(path: Path, model: DALLE, vae: DiscreteVAE, tokenizer: Tokenizer | None
                ) -> Path:
    """A DALL-E checkpoint as train writes one; tokenizer None: one that carries none."""
    configs: dict[str, Any] = {"model": model.config.to_dict(), "vae": vae.config.to_dict()}
    if tokenizer is not None:
        configs["tokenizer"] = tokenizer.to_dict()
    write_checkpoint_file(path, checkpoint_meta(
        "dalle", configs, {"epoch": 0, "step": 0}, [], "single", 1,
        weights=model.state_dict(), vae_weights=vae.state_dict()))
    return path


def png_tensor(path: Path) -> torch.Tensor:
    with Image.open(path) as image:
        mode = image.mode
        array = np.asarray(image, dtype=np.float32) / 255
    return torch.from_numpy(array).permute(2, 0, 1), mode


def test_gentxt_draws_images_from_the_completed_caption(tmp_path: Path) -> None:
    """The printed and saved caption is the model's completion (the reference: complete,
    then sample, with the seeded generator in that order), and the images are the ones
    that caption gives. Bug caught: images drawn from the prompt as typed."""
    model, vae, tok = tiny_parts()
    ckpt = write_dalle(tmp_path / "d.pt", model, vae, tok)
    config = GenerateConfig(num_images=2, batch_size=2, top_k=0.5, seed=5, gentxt=True)
    lines: list[str] = []
    [grid] = generate(str(ckpt), ["a red"], str(tmp_path / "out"), config, CPU, lines.append)

    generator = torch.Generator().manual_seed(5)
    prompt = torch.tensor([tok.encode("a red")])
    ids = model.caption_ids(model.complete_text(prompt, 0.5, 1.0, generator))
    caption = tok.decode(ids[0].tolist())
    assert caption.startswith("a red") and len(caption) > len("a red")
    assert (grid.parent / "caption.txt").read_text(encoding="utf-8") == caption + "\n"
    assert f"completed caption: {caption!r}" in lines
    after_completion = generator.get_state()
    want = model.generate_images(ids.expand(2, -1), vae, 0.5, 1.0, generator)
    got = torch.stack([png_tensor(grid.parent / f"{i}.png")[0] for i in range(2)])
    assert torch.allclose(got, want, atol=0.5 / 255 + 1e-6)

    generator.set_state(after_completion)
    as_typed = tokenize(tok, ["a red"], 12).expand(2, -1)
    assert not torch.allclose(model.generate_images(as_typed, vae, 0.5, 1.0, generator), want,
                              atol=2 / 255)


def test_transparent_vae_alpha_reaches_the_pngs(tmp_path: Path) -> None:
    """A 4-channel VAE's config travels in the DALL-E checkpoint, so generate decodes RGBA.
    Bug caught: PNGs written as RGB (alpha dropped)."""
    model, vae, tok = tiny_parts(channels=4)
    with torch.no_grad():  # alpha spread over (0, 1) rather than all near one value
        vae.decoder[-1].bias[3] = 0.3
    ckpt = write_dalle(tmp_path / "d.pt", model, vae, tok)
    config = GenerateConfig(num_images=2, batch_size=2, seed=1)
    [grid] = generate(str(ckpt), ["a blue box"], str(tmp_path / "out"), config, CPU,
                      lambda _: None)
    want = model.generate_images(tokenize(tok, ["a blue box"], 12).expand(2, -1), vae, 0.9,
                                 1.0, torch.Generator().manual_seed(1))
    assert want.shape[1] == 4
    for i in range(2):
        got, mode = png_tensor(grid.parent / f"{i}.png")
        assert mode == "RGBA"
        assert torch.allclose(got, want[i], atol=0.5 / 255 + 1e-6)
    assert png_tensor(grid)[1] == "RGBA"
    assert want[:, 3].min() < 0.9, "the check needs alpha below opaque"


def test_tokenizer_flags_against_the_checkpoint(tmp_path: Path) -> None:
    """Same tokenizer: fine; another: a ConfigError before any output exists. A checkpoint
    without a tokenizer takes the flags' one, if its vocabulary fits the model.
    Bug caught: --chinese silently re-tokenizing prompts for a byte-level model."""
    model, vae, tok = tiny_parts()
    ckpt = write_dalle(tmp_path / "d.pt", model, vae, tok)
    config = GenerateConfig(num_images=1, batch_size=1, seed=0)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="not the tokenizer"):
        generate(str(ckpt), ["x"], str(out), config, CPU, tokenizer=TokenizerConfig(chinese=True))
    assert not out.exists()
    bare = write_dalle(tmp_path / "bare.pt", model, vae, None)
    with pytest.raises(CheckpointError, match="carries no tokenizer"):
        generate(str(bare), ["x"], str(out), config, CPU, tokenizer=TokenizerConfig(chinese=True))
    assert not out.exists()
    assert generate(str(bare), ["x"], str(out), config, CPU, lambda _: None)  # bytes fit
    cjk_model, cjk_vae, _ = tiny_parts(tokenizer=CJKTokenizer())
    cjk_bare = write_dalle(tmp_path / "cjk.pt", cjk_model, cjk_vae, None)
    [grid] = generate(str(cjk_bare), ["一只狗"], str(tmp_path / "cjk"), config, CPU,
                      lambda _: None, tokenizer=TokenizerConfig(chinese=True))
    assert grid.exists()


def test_prompt_folders_keep_letters_of_any_script() -> None:
    """Bug caught: every Chinese prompt written to the one folder "prompt"."""
    assert prompt_dir_name("a small red circle, on the left!") == "a_small_red_circle_on_the_left"
    assert prompt_dir_name("一只狗在沙滩上奔跑。") == "一只狗在沙滩上奔跑"
    assert prompt_dir_name("一只狗") != prompt_dir_name("一只猫")
    assert prompt_dir_name("?!") == "prompt"


@pytest.mark.parametrize("null_cond_prob", [0.0, 0.1])
def test_guided_generate_warns_once_on_a_model_never_shown_the_null_caption(
        tmp_path: Path, null_cond_prob: float) -> None:
    """--cond_scale 3 samples what model.generate_images(cond_scale=3) samples, for every
    prompt; on a checkpoint trained without --null_cond_prob one warning line is printed
    (once per run, not per prompt or batch), and none when the model learned the null
    caption. Bugs caught: --cond_scale not reaching the sampler (images equal unguided
    ones), the warning printed per prompt, or printed for a model that has the null
    caption."""
    model, vae, tok = tiny_parts()
    model.config = replace(model.config, null_cond_prob=null_cond_prob)  # as trained
    ckpt = write_dalle(tmp_path / "d.pt", model, vae, tok)
    config = GenerateConfig(num_images=2, batch_size=1, top_k=0.5, seed=3, cond_scale=3.0)
    lines: list[str] = []
    prompts = ["a red box", "a blue dot"]
    grids = generate(str(ckpt), prompts, str(tmp_path / "out"), config, CPU, lines.append)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == (1 if null_cond_prob == 0 else 0), lines
    if warnings:
        assert "--cond_scale 3.0" in warnings[0] and "--null_cond_prob" in warnings[0]

    generator = torch.Generator().manual_seed(3)
    for prompt, grid in zip(prompts, grids, strict=True):
        text = tokenize(tok, [prompt], 12)
        want = torch.cat([model.generate_images(text, vae, 0.5, 1.0, generator, cond_scale=3.0)
                          for _ in range(2)])
        got = torch.stack([png_tensor(grid.parent / f"{i}.png")[0] for i in range(2)])
        assert torch.allclose(got, want, atol=0.5 / 255 + 1e-6), prompt
    generator = torch.Generator().manual_seed(3)
    unguided = model.generate_images(tokenize(tok, prompts[:1], 12), vae, 0.5, 1.0, generator)
    first = png_tensor(grids[0].parent / "0.png")[0]
    assert not torch.allclose(first, unguided[0], atol=2 / 255)
