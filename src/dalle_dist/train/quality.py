"""Image-quality metrics during training (`train --eval_every_n_steps`), from local files.

Every N optimizer steps and at the run's last step, the root samples one image for each
of a fixed list of captions (the same captions and the same random numbers each time,
so the curve moves with the weights only) and scores the images:

- FID (`--fid_weights`): torchmetrics' FrechetInceptionDistance over the features of a
  local extractor, against real images read once at the start: the Inception network of
  model/inception.py loaded from torch-fidelity's / pytorch-fid's weights file, or a
  saved module mapping uint8 images to features, TorchScript (clean-fid's and StyleGAN's
  `inception-2015-12-05.pt` are such modules, taking `return_features=True`) or
  torch.export;
- CLIP score (`--clip_dir`): torchmetrics' definition, the mean over images of 100 x the
  cosine between the image's and its caption's CLIP embeddings, floored at 0, from a
  local Hugging Face CLIP directory. torchmetrics' own CLIPScore is not used: it reads
  `get_image_features` as a tensor, which transformers 5 no longer returns;
- caption fidelity on the built-in shapes (data/scorer.py), as at the end of a run.

Every metric sees the 8-bit images written to NAME-samples/eval-step-N.png (one cell per
caption, in order): a score can be recomputed from the file. Nothing is downloaded: a
missing or wrong file is refused before training starts, in one line.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from dalle_dist.backends.verdict import error_line
from dalle_dist.data.images import make_grid
from dalle_dist.data.scorer import fidelity
from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.data.tokenizer import Tokenizer, tokenize
from dalle_dist.errors import ConfigError
from dalle_dist.model import DALLE, ImageTokenizer
from dalle_dist.model.inception import FIDInception
from dalle_dist.train.config import QualityConfig
from dalle_dist.train.evaluate import HELD_OUT_SEED_OFFSET

#: the generator seed every evaluation samples with
EVAL_SEED = 0
#: top-k filtering of the sampled tokens, as the sample grids and the fidelity check
FILTER_THRES = 0.9
#: OpenAI CLIP's pixel statistics, used when a CLIP directory has no preprocessor_config
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: images per CLIP or feature-extractor forward
CHUNK = 32
#: the captions drawn when the data holds none out and --eval_captions gives none
#: (folder or WebDataset data without --val_fraction: CLIP score only): everyday scenes
#: of the kind web-scale caption sets hold, cycled up to --eval_images
FIXED_CAPTIONS = (
    "a photo of a dog sitting on a wooden floor",
    "a red double-decker bus on a city street",
    "a bowl of fruit on a kitchen table",
    "a mountain lake at sunrise",
    "a person riding a bicycle along the beach",
    "a cup of coffee next to an open book",
    "a cat sleeping on a sofa",
    "a lighthouse on a rocky coast",
    "a plate of pasta with tomato sauce",
    "a snowy forest with tall pine trees",
    "a yellow taxi in the rain",
    "an old brick house with a green door",
    "a group of people walking in a park",
    "a sailboat on calm blue water",
    "a close-up of a sunflower",
    "a train crossing a bridge over a river",
)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """[N, C, H, W] in [0, 1] -> its first 3 channels as uint8, rounded as a PNG stores
    them (data/images.py tensor_to_pil): what every metric here sees."""
    return (images[:, :3].float().clamp(0, 1) * 255).round().to(torch.uint8)


class ModuleFeatures(nn.Module):
    """A saved feature extractor (TorchScript or torch.export): uint8 [N, 3, H, W] ->
    float [N, D]. TorchScript modules whose forward takes `return_features` (clean-fid's
    and StyleGAN's Inception) are asked for their features rather than their logits."""

    def __init__(self, module: Callable[..., torch.Tensor], kind: str) -> None:
        super().__init__()
        self.module, self.kind = module, kind
        schema = getattr(getattr(module, "forward", None), "schema", None)
        names = {a.name for a in schema.arguments} if schema is not None else set()
        self.kwargs = {"return_features": True} if "return_features" in names else {}
        self.num_features = 0  # probe_extractor sets it

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.module(images, **self.kwargs).float()
        return out.flatten(1) if out.ndim > 2 else out  # ([N, D, 1, 1] pooled maps)


def _saved_module(path: str) -> ModuleFeatures | None:
    """A TorchScript archive or a torch.export program at `path`; None when it is
    neither (a state dict, or not a torch file)."""
    with warnings.catch_warnings():  # torch.jit.load is deprecated, and such files are
        warnings.simplefilter("ignore", DeprecationWarning)  # what FID tools publish
        try:
            return ModuleFeatures(torch.jit.load(path, map_location="cpu").eval(),
                                  "TorchScript")
        except Exception:
            pass
    if not _is_export_archive(path):  # (torch.export.load logs a traceback on others)
        return None
    try:
        return ModuleFeatures(torch.export.load(path).module(), "torch.export")
    except Exception:
        return None


def _is_export_archive(path: str) -> bool:
    """A torch.export.save file: a zip archive with an `archive_format` record."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.rsplit("/", 1)[-1] == "archive_format"
                       for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def load_fid_extractor(path: str) -> nn.Module:
    """--fid_weights: a saved extractor (TorchScript, torch.export) or an Inception-v3
    state dict in torch-fidelity's layout; ConfigError otherwise. A saved extractor is
    probed with the run's images later (probe_extractor)."""
    flag = f"--fid_weights {path}"
    if not Path(path).is_file():
        raise ConfigError(f"{flag}: no such file",
                          "give the local Inception weights file (nothing is downloaded)")
    saved = _saved_module(path)
    if saved is not None:
        return saved.requires_grad_(False)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ConfigError(f"{flag}: neither a saved module nor a torch weights file "
                          f"({error_line(error)})",
                          "give torch-fidelity's weights-inception-2015-12-05-6726825d.pth"
                          ) from None
    network = FIDInception()
    if not isinstance(state, dict):
        raise ConfigError(f"{flag}: holds a {type(state).__name__}, not an Inception "
                          "state dict")
    try:
        network.load_state_dict(state)
    except RuntimeError as error:
        missing = sorted(name for name in set(network.state_dict()) - set(state)
                         if not name.endswith("num_batches_tracked"))  # (optional in a file)
        detail = (f"{len(missing)} of its tensors are missing, e.g. {missing[0]}" if missing
                  else error_line(error))
        raise ConfigError(f"{flag}: not the Inception-v3 weights FID uses ({detail})",
                          "give torch-fidelity's weights-inception-2015-12-05-6726825d.pth "
                          "or a saved feature extractor") from None
    return network.eval().requires_grad_(False)


def probe_extractor(extractor: nn.Module, path: str, image_size: int) -> None:
    """A saved extractor must map two uint8 images of the run's size to [2, D]; its D
    becomes num_features (torchmetrics reads it)."""
    if not isinstance(extractor, ModuleFeatures):
        return
    flag = f"--fid_weights {path}"
    probe = torch.randint(0, 256, (2, 3, image_size, image_size), dtype=torch.uint8)
    try:
        with torch.no_grad():
            out = extractor(probe)
    except Exception as error:
        raise ConfigError(f"{flag}: the {extractor.kind} module fails on uint8 images "
                          f"[2, 3, {image_size}, {image_size}]: {error_line(error)}") from None
    if out.ndim != 2 or out.shape[0] != 2 or not out.shape[1]:
        raise ConfigError(f"{flag}: the {extractor.kind} module maps 2 images to shape "
                          f"{list(out.shape)}, not [2, features]")
    extractor.num_features = int(out.shape[1])


def fid_metric(extractor: nn.Module) -> Any:
    """torchmetrics' FID over `extractor`, keeping its real features across resets, and
    computed from this rank's states alone."""
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance
    except ImportError as error:
        raise ConfigError(f"--fid_weights needs torchmetrics ({error_line(error)})",
                          "pip install 'dalle_dist[fid]'") from None
    # The root alone measures: torchmetrics' default all-gathers the states of every
    # rank in compute(), a collective the other ranks never join (a hang on 2 ranks).
    return FrechetInceptionDistance(feature=extractor, reset_real_features=False,
                                    sync_on_compute=False)


class ClipScorer:
    """torchmetrics' CLIP score from a local Hugging Face CLIP directory."""

    def __init__(self, directory: str, device: torch.device) -> None:
        flag = f"--clip_dir {directory}"
        folder = Path(directory)
        if not folder.is_dir():
            raise ConfigError(f"{flag}: no such directory",
                              "give a local CLIP directory (nothing is downloaded)")
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigError(f"{flag}: no readable config.json ({error_line(error)})",
                              "save one with CLIPModel.save_pretrained and "
                              "CLIPProcessor.save_pretrained") from None
        if config.get("model_type") != "clip":
            raise ConfigError(f"{flag}: config.json describes a {config.get('model_type')!r} "
                              "model, not 'clip'")
        try:
            from transformers import AutoTokenizer, CLIPModel
            from transformers.utils import logging as hf_logging
        except ImportError as error:
            raise ConfigError(f"--clip_dir needs transformers ({error_line(error)})",
                              "pip install 'dalle_dist[clip]'") from None
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # ("Loading weights": one line per load)
        try:
            self.model = CLIPModel.from_pretrained(folder, local_files_only=True)
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as error:
            raise ConfigError(f"{flag}: not a complete CLIP directory "
                              f"({error_line(error)})") from None
        self.model = self.model.to(device).eval().requires_grad_(False)
        self.device = device
        self.size, self.crop, mean, std = self._preprocessing(folder)
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def _preprocessing(self, folder: Path) -> tuple[int, int, Sequence[float], Sequence[float]]:
        """(shortest edge, crop side, mean, std) from preprocessor_config.json, else the
        vision tower's input side and OpenAI's statistics."""
        side = int(self.model.config.vision_config.image_size)
        path = folder / "preprocessor_config.json"
        values = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        size, crop = values.get("size", side), values.get("crop_size", side)
        size = size.get("shortest_edge", side) if isinstance(size, dict) else size
        crop = crop.get("height", side) if isinstance(crop, dict) else crop
        return (int(size), int(crop), values.get("image_mean", CLIP_MEAN),
                values.get("image_std", CLIP_STD))

    def pixels(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [N, 3, H, W] -> CLIP's input as its image processor makes it: the
        shortest edge resized with PIL's bicubic filter, a centre crop, normalised."""
        out = []
        for image in images:
            picture = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
            w, h = picture.size
            short, long = min(w, h), max(w, h)
            side = (self.size, int(self.size * long / short))
            picture = picture.resize(side if w <= h else side[::-1], Image.Resampling.BICUBIC)
            w, h = picture.size
            left, top = (w - self.crop) // 2, (h - self.crop) // 2
            picture = picture.crop((left, top, left + self.crop, top + self.crop))
            out.append(torch.from_numpy(np.asarray(picture, dtype=np.float32) / 255))
        x = torch.stack(out).permute(0, 3, 1, 2).to(self.device)
        return (x - self.mean) / self.std

    @torch.no_grad()
    def score(self, images: torch.Tensor, captions: Sequence[str]) -> float:
        """max(0, mean over pairs of 100 x cos(image embedding, caption embedding))."""
        limit = int(self.model.config.text_config.max_position_embeddings)
        total = 0.0
        for i in range(0, len(captions), CHUNK):
            text = self.tokenizer(list(captions[i:i + CHUNK]), padding=True, truncation=True,
                                  max_length=limit, return_tensors="pt").to(self.device)
            out = self.model(input_ids=text["input_ids"], attention_mask=text["attention_mask"],
                             pixel_values=self.pixels(images[i:i + CHUNK]))
            cos = F.cosine_similarity(out.image_embeds.float(), out.text_embeds.float(), dim=-1)
            total += float((100 * cos).sum())
        return max(total / len(captions), 0.0)


@dataclass
class EvalSet:
    """What each evaluation draws and compares with (on the root)."""

    captions: list[str]
    real: torch.Tensor | None  # uint8 [M, 3, H, W], FID's real images
    shapes: bool  # built-in shapes: the caption fidelity scorer applies


def read_captions(path: str, count: int) -> list[str]:
    """--eval_captions: the file's first `count` non-empty lines."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--eval_captions {path}: cannot read it ({error_line(error)})"
                          ) from None
    captions = [line.strip() for line in lines if line.strip()][:count]
    if not captions:
        raise ConfigError(f"--eval_captions {path}: holds no caption",
                          "write one caption per line")
    return captions


def eval_set(config: QualityConfig, held_out: Any, builtin: bool, image_size: int,
             channels: int, shapes_seed: int, decode: Callable[[torch.Tensor], torch.Tensor]
             ) -> EvalSet:
    """The captions and real images: the first --eval_images held-out samples, else (on
    built-in data) as many held-out scenes of the fidelity check, else FIXED_CAPTIONS
    and no real images; --eval_captions replaces the captions. `decode`: token shards'
    image tokens -> pixels."""
    count = config.eval_images
    captions: list[str] = []
    real = None
    if held_out is not None:
        batch = held_out.head(count)
        if batch is not None:
            images, _, captions = batch
            images = decode(images) if not images.is_floating_point() else images
            real = to_uint8(images)
            captions = list(captions)
    elif not builtin:
        captions = [FIXED_CAPTIONS[i % len(FIXED_CAPTIONS)] for i in range(count)]
    else:
        scenes = ShapesDataset(count, image_size, shapes_seed + HELD_OUT_SEED_OFFSET,
                               channels)
        pairs = [scenes[i] for i in range(count)]
        real = to_uint8(torch.stack([image for image, _ in pairs]))
        captions = [caption for _, caption in pairs]
    if config.eval_captions:
        captions = read_captions(config.eval_captions, count)
    if not captions:
        raise ConfigError("--eval_every_n_steps: the held-out part holds no sample",
                          "raise --val_fraction, or give --eval_captions FILE")
    if config.fid_weights and (real is None or len(real) < 2):
        raise ConfigError("--fid_weights: fewer than 2 held-out images to compare with",
                          "raise --val_fraction")
    return EvalSet(captions, real, builtin and not config.eval_captions)


class QualityEval:
    """The evaluation of one run. Every rank holds the cadence and the count (a sharded
    engine samples on every rank, with the same calls); the root alone holds the
    captions, the real images and the metrics."""

    def __init__(self, config: QualityConfig) -> None:
        self.config, self.every = config, config.eval_every_n_steps
        self.set: EvalSet | None = None
        self.images = config.eval_images  # the root's caption count, told to every rank
        self.extractor: nn.Module | None = None
        self.fid: Any = None
        self.clip: ClipScorer | None = None

    def load_files(self, device: torch.device) -> None:
        """On the root, first thing: --fid_weights and --clip_dir loaded, or refused in one
        line (before a built-in VAE trains or anything is written)."""
        if self.config.fid_weights:
            self.extractor = load_fid_extractor(self.config.fid_weights)
        if self.config.clip_dir:
            self.clip = ClipScorer(self.config.clip_dir, device)

    def bind(self, vae: ImageTokenizer, tokenizer: Tokenizer, text_seq_len: int,
             batch_size: int) -> None:
        """What sampling needs, on every rank, once the model's parts are known."""
        self.vae, self.tokenizer = vae, tokenizer
        self.text_seq_len, self.batch_size = text_seq_len, batch_size

    def prepare(self, data: EvalSet, image_size: int, device: torch.device) -> None:
        """On the root, before training: the captions and real images, whose features
        are taken once."""
        self.set = data
        if self.extractor is not None:
            assert data.real is not None and self.config.fid_weights
            probe_extractor(self.extractor, self.config.fid_weights, image_size)
            self.fid = fid_metric(self.extractor).to(device)
            with torch.no_grad():
                for i in range(0, len(data.real), CHUNK):
                    self.fid.update(data.real[i:i + CHUNK].to(device), real=True)

    @property
    def count(self) -> int:
        """Images per evaluation, on every rank: the root's caption count (fewer than
        --eval_images when the held-out part or --eval_captions holds fewer), which
        start_evaluation hands the others; sharded sampling makes as many calls on each."""
        return len(self.set.captions) if self.set is not None else self.images

    def due(self, step: int, last: bool) -> bool:
        return step % self.every == 0 or last

    def text(self) -> torch.Tensor:
        """The captions' ids (the root's); a rank without captions draws for zeros of the
        same shape, making the same calls through the shards."""
        if self.set is None:
            return torch.zeros(self.count, self.text_seq_len, dtype=torch.long)
        return tokenize(self.tokenizer, self.set.captions, self.text_seq_len, truncate=True)

    @torch.no_grad()
    def sample(self, model: DALLE, device: torch.device) -> torch.Tensor:
        """One image per caption, uint8, on the host, with EVAL_SEED's generator."""
        text = self.text().to(device)
        generator = torch.Generator(device).manual_seed(EVAL_SEED)
        return torch.cat([
            to_uint8(model.generate_images(text[i:i + self.batch_size], self.vae,
                                           FILTER_THRES, generator=generator)).cpu()
            for i in range(0, len(text), self.batch_size)])

    def score(self, images: torch.Tensor, device: torch.device) -> dict[str, float]:
        """The metrics of one evaluation's images (root only)."""
        assert self.set is not None
        record: dict[str, float] = {}
        if self.fid is not None:
            with torch.no_grad():
                for i in range(0, len(images), CHUNK):
                    self.fid.update(images[i:i + CHUNK].to(device), real=False)
                record["fid"] = float(self.fid.compute())
            self.fid.reset()  # the real features stay (reset_real_features=False)
        if self.clip is not None:
            record["clip_score"] = self.clip.score(images, self.set.captions)
        if self.set.shapes:
            record["caption_fidelity"] = fidelity(images.float() / 255, self.set.captions)
        return record

    @staticmethod
    def grid(images: torch.Tensor) -> Image.Image:
        """Every evaluated image at its own size, in caption order (rows of 8)."""
        return make_grid(images.float() / 255, nrow=8, min_cell=0)


__all__ = ["EVAL_SEED", "FIXED_CAPTIONS", "ClipScorer", "EvalSet", "ModuleFeatures",
           "QualityEval", "eval_set", "fid_metric", "load_fid_extractor", "probe_extractor",
           "read_captions", "to_uint8"]
