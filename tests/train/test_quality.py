"""train --eval_every_n_steps: FID from a local Inception file, CLIP score from a local CLIP
directory, caption fidelity on the built-in shapes (train/quality.py).

Nothing can be downloaded here, so the files are small stand-ins in the real formats
(tests/train/quality_files.py), read by the real loaders; the Inception network FID needs
is checked against torch-fidelity's own, on random weights in its file's layout. The two
rank run is in tests/backends/test_quality_ranks.py.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dalle_dist.data.scorer import fidelity
from dalle_dist.data.shapes import ShapesDataset
from dalle_dist.errors import ConfigError
from dalle_dist.model.inception import FIDInception
from dalle_dist.train.config import QualityConfig
from dalle_dist.train.evaluate import HELD_OUT_SEED_OFFSET
from dalle_dist.train.job import TrainJob
from dalle_dist.train.loss_plot import QUALITY_CURVES
from dalle_dist.train.quality import (
    ClipScorer,
    fid_metric,
    load_fid_extractor,
    probe_extractor,
    to_uint8,
)
from tests.backends.runs import Run
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli
from tests.train.quality_files import EVAL_IMAGES, TinyFeatures, eval_flags

#: torch-fidelity's source, unpacked by the Makefile's engines step (not installed)
FIDELITY_SRC = Path(sys.prefix) / "reference" / "torch-fidelity" / "torch_fidelity"


def torch_fidelity_inception() -> types.ModuleType:
    """torch-fidelity's Inception module, imported without its package's __init__ (which
    imports torchvision), then taken out of sys.modules again: a package there makes
    torchmetrics (in this process) take its torch-fidelity path."""
    assert FIDELITY_SRC.is_dir(), f"{FIDELITY_SRC} missing: `make test` unpacks it"
    package = types.ModuleType("torch_fidelity")
    package.__path__ = [str(FIDELITY_SRC)]
    sys.modules["torch_fidelity"] = package
    try:
        return importlib.import_module("torch_fidelity.feature_extractor_inceptionv3")
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "torch_fidelity"]:
            del sys.modules[name]


def test_inception_features_equal_torch_fidelity_s(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Random weights in the layout of torch-fidelity's weights file, loaded by
    --fid_weights' loader and by torch-fidelity: the 2048 features of odd-sized uint8
    images agree. Caught in a scratch copy: an average pool counting its padding
    (features up to 6.9 off). The file loads without a logged word (caught: trying it as
    a torch.export archive first logged a traceback)."""
    torch.manual_seed(0)
    state = {}
    for name, value in FIDInception().state_dict().items():
        if name.endswith("running_var"):
            state[name] = torch.rand_like(value) + 0.5
        elif name.endswith("num_batches_tracked"):
            state[name] = value
        else:
            state[name] = torch.randn_like(value) * (0.1 if "conv" in name else 0.5)
    path = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    torch.save(state, path)
    ours = load_fid_extractor(str(path))
    assert not caplog.records, caplog.text[:300]
    theirs = torch_fidelity_inception().FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048"], feature_extractor_weights_path=str(path))
    images = torch.randint(0, 256, (2, 3, 37, 50), dtype=torch.uint8)
    with torch.no_grad():
        mine, reference = ours(images), theirs(images)[0]
    assert mine.shape == (2, 2048)
    torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-5)


def test_clip_pixels_are_the_image_processor_s(quality_files: Path) -> None:
    """ClipScorer resizes and normalises as transformers' own CLIP image processor
    (bicubic PIL resize of the shortest edge, centre crop): a torch bicubic (another
    kernel) or a crop off-centre is caught."""
    from transformers import CLIPImageProcessorPil

    scorer = ClipScorer(str(quality_files / "clip"), torch.device("cpu"))
    processor = CLIPImageProcessorPil.from_pretrained(quality_files / "clip")
    for shape in ((2, 3, 48, 48), (2, 3, 40, 64)):
        images = torch.randint(0, 256, shape, dtype=torch.uint8)
        expected = processor(images=list(images), return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(scorer.pixels(images), expected)


def test_missing_and_wrong_files_are_refused_in_one_line(quality_files: Path,
                                                         tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not weights\n")
    wrong = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, wrong)
    a_list = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], a_list)
    for path, message in ((tmp_path / "none.pth", "no such file"),
                          (text, "neither a saved module nor a torch weights file"),
                          (wrong, "not the Inception-v3 weights FID uses (472 of its tensors "
                                  "are missing, e.g. Conv2d_1a_3x3.bn.bias)"),
                          (a_list, "holds a list, not an Inception state dict")):
        with pytest.raises(ConfigError, match="^" + re.escape(f"--fid_weights {path}: {message}")):
            load_fid_extractor(str(path))
    flat = tmp_path / "flat.pt"
    torch.jit.script(torch.nn.Flatten(0)).save(str(flat))
    with pytest.raises(ConfigError, match=r"TorchScript module maps 2 images to shape "
                                          r"\[6144\], not \[2, features\]"):
        probe_extractor(load_fid_extractor(str(flat)), str(flat), 32)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    exported = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(TinyFeatures(), (images,)), str(exported))
    extractor = load_fid_extractor(str(exported))
    probe_extractor(extractor, str(exported), 32)
    assert extractor.num_features == 15
    torch.testing.assert_close(extractor(images), TinyFeatures()(images))

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert"}')
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / "config.json").write_bytes((quality_files / "clip/config.json").read_bytes())
    for folder, message in ((tmp_path / "none", "no such directory"),
                            (tmp_path, "no readable config.json"),
                            (bert, "config.json describes a 'bert' model, not 'clip'"),
                            (incomplete, "not a complete CLIP directory")):
        with pytest.raises(ConfigError, match="^" + re.escape(f"--clip_dir {folder}: {message}")):
            ClipScorer(str(folder), torch.device("cpu"))


@pytest.mark.parametrize(("quality", "data", "message"), [
    ({"fid_weights": "i.pth"}, {}, "--fid_weights needs --eval_every_n_steps"),
    ({"eval_every_n_steps": 5, "fid_weights": "i.pth", "eval_images": 1}, {},
     "--eval_images must be >= 2 with --fid_weights"),
    ({"eval_every_n_steps": 5}, {"image_text_folder": "pics"},
     "--eval_every_n_steps has nothing to measure on this data"),
    ({"eval_every_n_steps": 5, "fid_weights": "i.pth"}, {"image_text_folder": "pics"},
     "--fid_weights compares the samples with held-out images"),
])
def test_flags_that_cannot_measure_are_refused(quality: dict, data: dict, message: str) -> None:
    from dalle_dist.data import DataConfig

    job = TrainJob(quality=QualityConfig(**quality), data=DataConfig(**data))
    with pytest.raises(ConfigError, match=message):
        job.validate()


def test_the_cli_refuses_a_missing_file_before_anything_is_written(tmp_path: Path) -> None:
    """From the command line, as a user meets it: one line, exit 2, no traceback, no
    checkpoint, metrics or built-in VAE trained first."""
    result = run_cli("train", *TINY_DALLE_FLAGS, "--eval_every_n_steps", "2",
                     "--fid_weights", "inception.pth", "--dalle_output_file_name", "d",
                     cwd=tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert_user_error(result, "--fid_weights inception.pth: no such file")
    assert not any(tmp_path.iterdir()), "nothing written"


def cells(png: Path, count: int) -> torch.Tensor:
    """The images of an eval-step grid (rows of 8, 2 px gaps, each at its own size)."""
    grid = np.asarray(Image.open(png).convert("RGB"))
    side = (grid.shape[1] - 2) // 8 - 2
    out = []
    for i in range(count):
        r, c = divmod(i, 8)
        y, x = 2 + r * (side + 2), 2 + c * (side + 2)
        out.append(torch.from_numpy(grid[y:y + side, x:x + side].copy()).permute(2, 0, 1))
    return torch.stack(out)


def test_logged_metrics_are_those_of_the_written_images(
        trained: Callable[..., Run], quality_files: Path) -> None:
    """One process, built-in shapes, an evaluation at steps 2, 4 and 5: each logged FID,
    CLIP score and caption fidelity is recomputed here from the eval-step PNG it wrote and
    the held-out scenes (FID with the extractor's eager twin). Caught in a scratch copy:
    real images of other scenes (FID 1.953 against 1.988), CLIP scoring the captions out
    of order. The weights equal those of the run without evaluation (caught: an
    evaluation leaving the EMA swapped in), the records reach TensorBoard, and the loss
    plot gains its quality panel."""
    run = trained("single", "fp32", *eval_flags(quality_files), "--tensorboard_dir", "tb")
    plain = trained("single", "fp32")
    for name, value in plain.payload["weights"].items():
        assert torch.equal(run.payload["weights"][name], value), name

    records = {r["step"]: r for r in run.metrics if "fid" in r}
    assert sorted(records) == [2, 4, 5]
    samples = run.folder / "dalle-samples"
    scorer = ClipScorer(str(quality_files / "clip"), torch.device("cpu"))
    for step, record in records.items():
        images = cells(samples / f"eval-step-{step:07d}.png", EVAL_IMAGES)
        scenes = ShapesDataset(EVAL_IMAGES, images.shape[-1], HELD_OUT_SEED_OFFSET)
        real = to_uint8(torch.stack([scenes[i][0] for i in range(EVAL_IMAGES)]))
        captions = [scenes[i][1] for i in range(EVAL_IMAGES)]
        fid = fid_metric(TinyFeatures())
        fid.update(real, real=True)
        fid.update(images, real=False)
        assert record["fid"] == pytest.approx(float(fid.compute()), rel=1e-5)
        assert record["clip_score"] > 0  # (not floored: pairs out of order would show)
        assert record["clip_score"] == scorer.score(images, captions)
        assert record["caption_fidelity"] == fidelity(images.float() / 255, captions)
    assert "evaluation every 2 steps and at the end: 8 images; FID against 8 real images, " \
           "CLIP score, caption fidelity" in run.text

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.folder / "tb"), size_guidance={"scalars": 0}).Reload()
    logged = events.Scalars("fid")
    assert [e.step for e in logged] == [2, 4, 5]
    assert [e.value for e in logged] == pytest.approx([records[s]["fid"] for s in (2, 4, 5)])
    assert "evaluation" in events.Tags()["images"]

    plot = np.asarray(Image.open(run.folder / "dalle-loss.png").convert("RGB"))
    for key, _, colour in QUALITY_CURVES:
        assert (plot == np.array(colour)).all(axis=-1).sum() > 50, key


def test_the_evaluation_set_is_the_first_held_out_samples_on_any_rank(tmp_path: Path) -> None:
    """A folder and WebDataset shards with --val_fraction: whichever rank of 1 or 2 builds
    it, the evaluation set is the same held-out images and captions (not the rank's
    share: an FID curve must not move with the rank count of a resumed run), and
    --eval_captions replaces the captions only; without a held-out part, the fixed list."""
    from dalle_dist.data import CaptionCollate, DataConfig, make_loader
    from dalle_dist.data.tokenizer import ByteTokenizer
    from dalle_dist.data.wds import WebDatasetLoader
    from dalle_dist.train.quality import FIXED_CAPTIONS, eval_set
    from tests.data.test_split import _folder
    from tests.data.test_wds import write_shards

    collate = CaptionCollate(ByteTokenizer(), 24, False)
    folder = _folder(tmp_path / "folder", 30)
    write_shards(tmp_path / "shards", 4, 9)
    config = QualityConfig(eval_every_n_steps=1, eval_images=5, fid_weights="i.pth")

    def held_out(source: str, rank: int, world: int) -> object:
        if source == "folder":
            loader, _ = make_loader(DataConfig(image_text_folder=str(folder)), 16, 2, rank,
                                    world, 0, collate, True, val_fraction=0.3)
            return loader.held_out
        return WebDatasetLoader(str(tmp_path / "shards"), "png,txt", 16, 1.0, 2, rank, world,
                                0, 0, collate, True, val_fraction=0.3).held_out

    firsts = {}
    for source in ("folder", "shards"):
        sets = [eval_set(config, held_out(source, rank, world), False, 16, 3, 0, None)
                for rank, world in ((0, 1), (0, 2), (1, 2))]
        first = firsts[source] = sets[0]
        assert len(first.captions) == 5 and first.real.shape == (5, 3, 16, 16)
        assert first.real.dtype == torch.uint8 and not first.shapes
        everything = [c for (_, _, caps), n in held_out(source, 0, 1).batches() for c in caps[:n]]
        assert first.captions == everything[:5], source
        for other in sets[1:]:
            assert other.captions == first.captions and torch.equal(other.real, first.real)
    captions = tmp_path / "captions.txt"
    captions.write_text("a red circle\n\n  a blue square  \n")
    replaced = eval_set(QualityConfig(eval_every_n_steps=1, eval_images=5,
                                      eval_captions=str(captions)),
                        held_out("folder", 0, 1), False, 16, 3, 0, None)
    assert replaced.captions == ["a red circle", "a blue square"]
    assert torch.equal(replaced.real, firsts["folder"].real)
    # no held-out part: the fixed list, cycled, and no real images (CLIP score only)
    fixed = eval_set(QualityConfig(eval_every_n_steps=1, eval_images=20, clip_dir="c"), None,
                     False, 16, 3, 0, None)
    assert fixed.captions == [*FIXED_CAPTIONS, *FIXED_CAPTIONS[:4]] and fixed.real is None
