"""`generate`: prompts -> PNG images and a grid per prompt, from a DALL-E checkpoint."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dalle_dist.backends.precision_kinds import DEFAULT_PRECISION, PRECISION_KINDS, PRECISIONS
from dalle_dist.checkpoint.load import dalle_parts, load_checkpoint
from dalle_dist.checkpoint.taming import GENERATE_FIX, TamingConfig, check_carried_vqgan
from dalle_dist.checkpoint.tools import choose_weights
from dalle_dist.config_base import option
from dalle_dist.data.config import TokenizerConfig
from dalle_dist.data.images import make_grid, save_png, tensor_to_pil
from dalle_dist.data.tokenizer import Tokenizer, caption_too_long, tokenize
from dalle_dist.errors import ConfigError
from dalle_dist.fileio import atomic_writer, ensure_writable_dir
from dalle_dist.model import DALLE, ImageTokenizer
from dalle_dist.model.decoding import StaticDecoder
from dalle_dist.model.init import on_meta
from dalle_dist.model.kernels import check_flex_toolchain
from dalle_dist.model.toolchain import require_toolchain
from dalle_dist.train.cuda_settings import TF32_ON, set_cudnn_benchmark, set_tf32


@dataclass(frozen=True)
class GenerateConfig:
    num_images: int = option(16, "images per prompt")
    batch_size: int = option(16, "images sampled at once")
    #: DALLE-pytorch's filter_thres
    top_k: float = option(0.9, "filter threshold: keep the best (1 - top_k) of image tokens")
    temperature: float = option(
        1.0, "sampling temperature: below 1 sharpens the token distribution, above 1 "
        "flattens it")
    seed: int | None = option(None, "for repeatable samples", default_text="default: random")
    truncate_captions: bool = option(
        False, "cut prompts longer than the model's text length instead of stopping")
    cond_scale: float = option(
        1.0, "classifier-free guidance: logits = null + (cond - null) x S, the captioned and "
        "the null-caption pass sampled in one doubled batch (about 2x the compute per image); "
        "needs a model trained with --null_cond_prob. 1: no guidance", metavar="S")
    compile: bool = option(
        False, "compile the decode step: torch.compile on CPU, CUDA graphs (mode "
               "reduce-overhead) on CUDA; same images, faster once compiled (compiling "
               "takes a while, once per batch size: worth it for many images)")
    precision: str = option(
        DEFAULT_PRECISION, "the DALL-E's weights while sampling. bf16 and fp16 halve the "
        "bytes each decode step reads, which bounds sampling at small batches (on a CPU "
        "without fp16 arithmetic, larger batches are compute-bound and fp16 can be slower "
        "than fp32 there); the images may differ from "
        "fp32's by rounding. The VAE decodes in fp32", choices=PRECISIONS)
    no_ema: bool = option(
        False, "sample from the trained weights even where the checkpoint holds EMA "
        "weights (train --ema_decay), which it samples from by default")
    gentxt: bool = option(
        False, "complete each prompt with the model's own text predictions first (sampled "
        "with --top_k and --temperature, as DALLE-pytorch's generate_texts), then draw the "
        "images from the completed caption; it is printed and saved as caption.txt, and an "
        "empty prompt starts from nothing")

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
        if not (math.isfinite(self.cond_scale) and self.cond_scale >= 0):
            raise ConfigError(f"--cond_scale must be a number >= 0, got {self.cond_scale}",
                              "1 samples without guidance; about 3 is typical with it")

    def check_precision(self, device: torch.device) -> torch.dtype | None:
        """The dtype to cast the DALL-E to (None: keep fp32), refused where the device
        cannot compute in it (bf16 on a GPU older than compute capability 8.0)."""
        kind = PRECISION_KINDS[self.precision]
        verdict = kind.verdict(device.type == "cuda")
        if not verdict.usable:
            raise ConfigError(f"--precision {self.precision}: {verdict.reason}", verdict.fix)
        return kind.dtype


@dataclass(frozen=True)
class PromptsConfig:
    """What `generate` samples from, for which prompts, and where the images go."""

    dalle_path: str = option(
        "", "DALL-E checkpoint: a file, a DeepSpeed checkpoint directory or a safetensors "
        "export (dalle-dist checkpoint export)", metavar="PATH", required=True)
    text: str = option(
        "", 'prompt(s), "|" between prompts, e.g. "a small red circle on the left|a large '
        'blue square at the top"', required=True)
    outputs_dir: str = option(
        "outputs", "folder that receives one sub-folder of PNGs and a grid.png per prompt",
        metavar="DIR")


@dataclass(frozen=True)
class GenerateJob:
    """Everything `dalle-dist generate` reads (as train.job.TrainJob for `train`)."""

    prompts: PromptsConfig
    sampling: GenerateConfig = field(default_factory=GenerateConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    taming: TamingConfig = field(default_factory=TamingConfig)
    device: str | None = None  # --device (DistributedConfig's flag); None: a GPU if any
    no_tf32: bool = False  # --no_tf32 (ComputeConfig's flag, as train's)

    def validate(self) -> None:
        self.sampling.validate()
        self.taming.validate(GENERATE_FIX)


@dataclass
class Sampler:
    """A DALL-E checkpoint ready to sample: the model, its VAE (or VQGAN) and its tokenizer."""

    model: DALLE
    vae: ImageTokenizer
    tokenizer: Tokenizer
    weights: str = "trained"  # which set the model holds: "ema" or "trained"


def load_sampler(path: str | Path, device: torch.device, flag: str = "--dalle_path",
                 tokenizer: TokenizerConfig | None = None,
                 taming: TamingConfig | None = None,
                 dtype: torch.dtype | None = None, use_ema: bool = True) -> Sampler:
    """From a checkpoint file, a DeepSpeed directory, or a safetensors export.

    The checkpoint carries its image tokenizer and text tokenizer. tokenizer: the command's
    --bpe_path / --hug / --chinese; they must agree with the tokenizer the checkpoint
    carries, and choose it only where it carries none. taming: DALLE-pytorch's --taming /
    --vqgan_* flags, which then must name that same VQGAN (check_carried_vqgan). dtype:
    the DALL-E's weights are cast to it after loading (--precision); the VAE stays fp32.
    use_ema: the checkpoint's EMA weights where it holds them (False: --no_ema)."""
    if Path(path).suffix in (".json", ".safetensors"):
        from dalle_dist.checkpoint.export import load_exported

        payload = load_exported(path, flag)
        if payload["kind"] != "dalle":
            raise ConfigError(f"{flag} {path} is an export of a VAE, not of a DALL-E",
                              "export the DALL-E checkpoint")
    else:
        payload = load_checkpoint(str(path), flag, "dalle", with_optimizer=False)
    if taming is not None:
        check_carried_vqgan(payload["configs"]["vae"], taming, flag, path)
    payload, chosen = choose_weights(payload, "auto" if use_ema else "trained",
                                     f"{flag} {path}")
    config, vae, tok = dalle_parts(payload, tokenizer, f"{flag} {path}")
    # Built on the meta device and given the file's tensors (assign): no random weights are
    # drawn only to be overwritten, and the one copy made is the cast onto the device (to
    # fp32 without --precision, as a file of 16-bit weights was read before).
    model = on_meta(lambda: DALLE(config))
    model.load_state_dict(payload["weights"], assign=True)
    model = model.to(device=device, dtype=dtype or torch.float32)
    return Sampler(model.eval(), vae.to(device).eval(), tok, chosen)


def split_prompts(text: str) -> list[str]:
    """DALLE-pytorch's --text takes several prompts separated by '|'."""
    return [p.strip() for p in text.split("|")]


def prompt_dir_name(prompt: str) -> str:
    """The prompt's letters and digits joined by "_"; letters of any script, so Chinese
    prompts (--chinese) get folders of their own rather than all sharing "prompt"."""
    name = re.sub(r"[\W_]+", "_", prompt).strip("_")[:100]
    return name or "prompt"


def prompt_ids(tokenizer: Tokenizer, prompt: str, text_seq_len: int, truncate: bool
               ) -> torch.Tensor:
    """[1, k] ids of a prompt for --gentxt to continue (no padding: the model writes it)."""
    ids = tokenizer.encode(prompt)
    if len(ids) > text_seq_len:
        if not truncate:
            raise caption_too_long(prompt, len(ids), text_seq_len)
        ids = ids[:text_seq_len]
    return torch.tensor([ids], dtype=torch.long)


def complete_caption(sampler: Sampler, prompt: str, config: GenerateConfig,
                     generator: torch.Generator) -> tuple[str, torch.Tensor]:
    """--gentxt: the completed caption and its [text_seq_len] ids, which the images are
    then drawn from."""
    model = sampler.model
    ids = prompt_ids(sampler.tokenizer, prompt, model.config.text_seq_len,
                     config.truncate_captions)
    completed = model.complete_text(ids.to(model.text_emb.weight.device), config.top_k,
                                    config.temperature, generator)
    text = model.caption_ids(completed)[0]
    return sampler.tokenizer.decode(text.tolist()), text


def generate(dalle_path: str, prompts: Sequence[str], outputs_dir: str, config: GenerateConfig,
             device: torch.device, log: Callable[[str], None] = print,
             tokenizer: TokenizerConfig | None = None,
             taming: TamingConfig | None = None, tf32: bool = True) -> list[Path]:
    """Write num_images PNGs and grid.png per prompt; returns the grid paths.
    tokenizer: --bpe_path / --hug / --chinese (see load_sampler); taming: the --taming /
    --vqgan_* flags, checked against the checkpoint's VQGAN. On CUDA, TF32 (unless
    `tf32` is False: --no_tf32) and cuDNN's autotuning are set as train sets them
    (train.cuda_settings)."""
    config.validate()
    dtype = config.check_precision(device)
    if config.compile:  # inductor builds the decode step's kernels (model/toolchain.py)
        require_toolchain(device.type, "generate --compile", "drop --compile")
    if taming is not None:
        taming.validate(GENERATE_FIX)
    if not prompts or (not config.gentxt and any(not p.strip() for p in prompts)):
        raise ConfigError("--text holds an empty prompt",
                          'give some words, e.g. --text "a red circle", or pass --gentxt to '
                          "let the model write the caption")
    out_root = ensure_writable_dir(outputs_dir, "--outputs_dir")
    if set_tf32(device, tf32):
        log(TF32_ON)
    set_cudnn_benchmark(device)
    sampler = load_sampler(dalle_path, device, tokenizer=tokenizer, taming=taming, dtype=dtype,
                           use_ema=not config.no_ema)
    check_flex_toolchain(sampler.model.config.attn_types, "auto", device)
    if sampler.weights == "ema":
        log("sampling from the checkpoint's EMA weights (--no_ema: its trained weights)")
    if config.cond_scale != 1.0 and not sampler.model.config.null_cond_prob:
        log(f"warning: --cond_scale {config.cond_scale} on a model trained without "
            "--null_cond_prob: it never saw the null caption, so guidance has nothing to "
            "steer by (sampling goes on)")
    text_seq_len = sampler.model.config.text_seq_len
    if config.gentxt:
        for prompt in prompts:  # every prompt checked before the first is sampled
            prompt_ids(sampler.tokenizer, prompt, text_seq_len, config.truncate_captions)
        all_text = [None] * len(prompts)
    else:
        all_text = list(tokenize(sampler.tokenizer, prompts, text_seq_len,
                                 config.truncate_captions))
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
        if text is None:  # --gentxt
            prompt, text = complete_caption(sampler, prompt, config, generator)
            log(f"completed caption: {prompt!r}")
        folder = out_root / prompt_dir_name(prompt)
        folder.mkdir(parents=True, exist_ok=True)
        if config.gentxt:
            with atomic_writer(folder / "caption.txt") as f:
                f.write((prompt + "\n").encode("utf-8"))
        images = []
        for start in range(0, config.num_images, config.batch_size):
            n = min(config.batch_size, config.num_images - start)
            batch = text.to(device).expand(n, -1)
            if n not in decoders:
                decoders[n] = StaticDecoder(sampler.model, n, compiled=config.compile,
                                            cond_scale=config.cond_scale)
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
