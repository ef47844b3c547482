"""`generate`: prompts -> PNG images and a grid per prompt, from a DALL-E checkpoint."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dalle_dist.checkpoint.load import dalle_parts, load_checkpoint
from dalle_dist.checkpoint.taming import GENERATE_FIX, TamingConfig, check_carried_vqgan
from dalle_dist.config_base import option
from dalle_dist.data.images import make_grid, save_png, tensor_to_pil
from dalle_dist.data.tokenizer import Tokenizer, tokenize
from dalle_dist.errors import ConfigError
from dalle_dist.fileio import ensure_writable_dir
from dalle_dist.model import DALLE, ImageTokenizer
from dalle_dist.model.decoding import StaticDecoder


@dataclass(frozen=True)
class GenerateConfig:
    num_images: int = option(16, "images per prompt")
    batch_size: int = option(16, "images sampled at once")
    #: DALLE-pytorch's filter_thres
    top_k: float = option(0.9, "filter threshold: keep the best (1 - top_k) of image tokens")
    temperature: float = option(1.0, "")
    seed: int | None = option(None, "for repeatable samples", default_text="default: random")
    truncate_captions: bool = option(
        False, "cut prompts longer than the model's text length instead of stopping")
    compile: bool = option(
        False, "compile the decode step: torch.compile on CPU, CUDA graphs (mode "
               "reduce-overhead) on CUDA; same images, faster once compiled (compiling "
               "takes seconds to a minute, once per batch size)")

    def validate(self) -> None:
        if self.num_images <= 0:
            raise ConfigError(f"--num_images must be positive, got {self.num_images}")
        if self.batch_size <= 0:
            raise ConfigError(f"--batch_size must be positive, got {self.batch_size}")
        if not 0.0 <= self.top_k < 1.0:
            raise ConfigError(f"--top_k must be in [0, 1), got {self.top_k}",
                              "0.9 keeps the best 10% of image tokens")
        if self.temperature <= 0:
            raise ConfigError(f"--temperature must be positive, got {self.temperature}")


@dataclass
class Sampler:
    """A DALL-E checkpoint ready to sample: the model, its VAE (or VQGAN) and its tokenizer."""

    model: DALLE
    vae: ImageTokenizer
    tokenizer: Tokenizer


def load_sampler(path: str | Path, device: torch.device, flag: str = "--dalle_path",
                 taming: TamingConfig | None = None) -> Sampler:
    """From a checkpoint file, a DeepSpeed directory, or a safetensors export.

    The checkpoint carries its image tokenizer; taming: DALLE-pytorch's --taming /
    --vqgan_* flags, which then must name that same VQGAN (check_carried_vqgan)."""
    if Path(path).suffix in (".json", ".safetensors"):
        from dalle_dist.checkpoint.export import load_exported

        payload = load_exported(path, flag)
        if payload["kind"] != "dalle":
            raise ConfigError(f"{flag} {path} is an export of a VAE, not of a DALL-E",
                              "export the DALL-E checkpoint")
    else:
        payload = load_checkpoint(str(path), flag, "dalle")
    if taming is not None:
        check_carried_vqgan(payload["configs"]["vae"], taming, flag, path)
    config, vae, tokenizer = dalle_parts(payload)
    model = DALLE(config)
    model.load_state_dict(payload["weights"])
    return Sampler(model.to(device).eval(), vae.to(device).eval(), tokenizer)


def split_prompts(text: str) -> list[str]:
    """DALLE-pytorch's --text takes several prompts separated by '|'."""
    return [p.strip() for p in text.split("|")]


def prompt_dir_name(prompt: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9]+", "_", prompt).strip("_")[:100]
    return name or "prompt"


def generate(dalle_path: str, prompts: Sequence[str], outputs_dir: str, config: GenerateConfig,
             device: torch.device, log: Callable[[str], None] = print,
             taming: TamingConfig | None = None) -> list[Path]:
    """Write num_images PNGs and grid.png per prompt; returns the grid paths.
    taming: the --taming / --vqgan_* flags, checked against the checkpoint's VQGAN."""
    config.validate()
    if taming is not None:
        taming.validate(GENERATE_FIX)
    if not prompts or any(not p.strip() for p in prompts):
        raise ConfigError("--text holds an empty prompt",
                          'give some words, e.g. --text "a red circle"')
    out_root = ensure_writable_dir(outputs_dir, "--outputs_dir")
    sampler = load_sampler(dalle_path, device, taming=taming)
    text_seq_len = sampler.model.config.text_seq_len
    all_text = tokenize(sampler.tokenizer, prompts, text_seq_len, config.truncate_captions)
    generator = torch.Generator(device)
    if config.seed is not None:
        generator.manual_seed(config.seed)
    else:
        generator.seed()

    # One decoder per batch size (the full one and a last partial one): its cache and,
    # with --compile, its compiled step are reused by every prompt.
    decoders: dict[int, StaticDecoder] = {}
    grids = []
    for prompt, text in zip(prompts, all_text, strict=True):
        folder = out_root / prompt_dir_name(prompt)
        folder.mkdir(parents=True, exist_ok=True)
        images = []
        for start in range(0, config.num_images, config.batch_size):
            n = min(config.batch_size, config.num_images - start)
            batch = text.to(device).expand(n, -1)
            if n not in decoders:
                decoders[n] = StaticDecoder(sampler.model, n, compiled=config.compile)
            images.append(sampler.model.generate_images(
                batch, sampler.vae, config.top_k, config.temperature, generator,
                decoder=decoders[n]).cpu())
        stacked = torch.cat(images)
        for i, image in enumerate(stacked):
            save_png(tensor_to_pil(image), folder / f"{i}.png")
        save_png(make_grid(stacked), folder / "grid.png")
        grids.append(folder / "grid.png")
        log(f"{prompt!r}: {len(stacked)} images in {folder}")
    return grids
