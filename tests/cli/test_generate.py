"""`generate` end to end: the files a user gets, and that --seed makes them repeatable.

Three real runs of the CLI on tiny_dalle are shared by the module (each costs a process
start), then each test reads what they wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import assert_user_error, run_cli

PROMPTS = "a small red circle on the left|a large blue square at the top"
FOLDERS = ["a_small_red_circle_on_the_left", "a_large_blue_square_at_the_top"]
FILES = {"0.png", "1.png", "2.png", "grid.png"}


@dataclass(frozen=True)
class Run:
    outputs: Path
    stdout: str


def generate(tiny_dalle: Path, outputs: Path, seed: int) -> Run:
    """Three images per prompt in batches of two, so the last batch is a partial one."""
    result = run_cli("generate", "--dalle_path", str(tiny_dalle), "--text", PROMPTS,
                     "--num_images", "3", "--batch_size", "2", "--seed", str(seed),
                     "--outputs_dir", str(outputs), "--device", "cpu", cwd=outputs.parent)
    assert result.returncode == 0, result.stderr
    return Run(outputs, result.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_dalle: Path) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("generate")
    return {"seed7": generate(tiny_dalle, root / "seed7", 7),
            "seed7-again": generate(tiny_dalle, root / "seed7-again", 7),
            "seed8": generate(tiny_dalle, root / "seed8", 8)}


def png_bytes(outputs: Path) -> dict[str, bytes]:
    return {str(p.relative_to(outputs)): p.read_bytes() for p in sorted(outputs.rglob("*.png"))}


def test_writes_images_and_grid_per_prompt(runs: dict[str, Run]) -> None:
    outputs = runs["seed7"].outputs
    assert sorted(p.name for p in outputs.iterdir()) == sorted(FOLDERS)
    for folder in FOLDERS:
        assert {p.name for p in (outputs / folder).iterdir()} == FILES
        for name in ("0.png", "1.png", "2.png"):
            with Image.open(outputs / folder / name) as image:
                assert image.size == (16, 16)
                assert image.mode == "RGB"
        with Image.open(outputs / folder / "grid.png") as grid:
            # three 16px images need two rows of two
            assert grid.width >= 32 and grid.height >= 32


def test_prints_grid_paths(runs: dict[str, Run]) -> None:
    run = runs["seed7"]
    printed = [line.removeprefix("grid: ") for line in run.stdout.splitlines()
               if line.startswith("grid: ")]
    assert printed == [str(run.outputs / folder / "grid.png") for folder in FOLDERS]


def test_same_seed_gives_identical_pngs(runs: dict[str, Run]) -> None:
    first = png_bytes(runs["seed7"].outputs)
    assert len(first) == 2 * len(FILES)
    assert first == png_bytes(runs["seed7-again"].outputs)


def test_other_seed_gives_other_images(runs: dict[str, Run]) -> None:
    first, other = png_bytes(runs["seed7"].outputs), png_bytes(runs["seed8"].outputs)
    assert first.keys() == other.keys()
    assert first != other


@pytest.mark.slow  # torch.compile with Inductor: 20-40 s with a cold cache
def test_compile_gives_the_same_images(runs: dict[str, Run], tiny_dalle: Path,
                                       tmp_path: Path) -> None:
    """--compile (torch.compile of the decode step on CPU) samples the same tokens as the
    eager runs: the first batch of the first prompt, same seed, gives byte-identical PNGs.
    One batch size, so one compile. Bug: the flag parsed but never reaching the decoder
    would pass here too, which test_sampling's compiled == eager test covers at the model;
    this one catches a compiled CLI path that samples differently (other generator use,
    a decoder shared across batch sizes) or crashes."""
    outputs = tmp_path / "compiled"
    result = run_cli("generate", "--dalle_path", str(tiny_dalle), "--text", PROMPTS.split("|")[0],
                     "--num_images", "2", "--batch_size", "2", "--seed", "7", "--compile",
                     "--outputs_dir", str(outputs), "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    eager = runs["seed7"].outputs / FOLDERS[0]
    for name in ("0.png", "1.png"):
        assert (outputs / FOLDERS[0] / name).read_bytes() == (eager / name).read_bytes(), name


def test_compile_without_a_cpp_compiler_is_refused_before_sampling(tiny_dalle: Path,
                                                                    tmp_path: Path) -> None:
    """--compile where inductor has no C++ compiler (CXX names none): one error line before
    the checkpoint is read, no outputs folder. Bug: no check, so the run loaded the model
    and failed at the first compiled decode step with inductor's traceback."""
    outputs = tmp_path / "out"
    result = run_cli("generate", "--dalle_path", str(tiny_dalle), "--text", "a red circle",
                     "--compile", "--outputs_dir", str(outputs), "--device", "cpu",
                     cwd=tmp_path, env={"CXX": str(tmp_path / "no-such-g++")})
    assert_user_error(result, "generate --compile needs a C++ compiler on CPU",
                      "apt-get install g++", "or drop --compile")
    assert not outputs.exists()


def test_precision_samples_from_the_cast_model(sharp_dalle: Path, tmp_path: Path) -> None:
    """--precision fp16 casts the DALL-E before sampling, and only the DALL-E: its images
    equal those of the checkpoint's model cast with .half() (VAE left in fp32) and sampled
    through a StaticDecoder with the same seed, and differ from the fp32 run's (sharp_dalle's
    std-1 weights move the logits enough for fp16 rounding to change tokens). Bugs: the
    flag parsed but never applied (the fp32 images), the cast applied after the decoder
    built its fp32 cache, the VAE cast too (other pixels)."""
    import numpy as np
    import torch

    from dalle_dist.data.images import tensor_to_pil
    from dalle_dist.data.tokenizer import tokenize
    from dalle_dist.generate import load_sampler
    from dalle_dist.model.decoding import StaticDecoder

    prompt = PROMPTS.split("|")[0]
    pixels = {}
    for precision in ("fp32", "fp16"):
        outputs = tmp_path / precision
        result = run_cli("generate", "--dalle_path", str(sharp_dalle), "--text", prompt,
                         "--num_images", "2", "--batch_size", "2", "--seed", "7",
                         "--precision", precision, "--outputs_dir", str(outputs),
                         "--device", "cpu", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        pixels[precision] = [np.asarray(Image.open(outputs / FOLDERS[0] / f"{i}.png"))
                             for i in range(2)]

    sampler = load_sampler(sharp_dalle, torch.device("cpu"))
    model = sampler.model.half()
    text = tokenize(sampler.tokenizer, [prompt], model.config.text_seq_len).expand(2, -1)
    images = model.generate_images(text, sampler.vae, 0.9, 1.0,
                                   torch.Generator().manual_seed(7),
                                   decoder=StaticDecoder(model, 2))
    expected = [np.asarray(tensor_to_pil(image)) for image in images]
    for got, want in zip(pixels["fp16"], expected, strict=True):
        assert np.array_equal(got, want)
    assert any(not np.array_equal(a, b) for a, b in zip(pixels["fp16"], pixels["fp32"],
                                                          strict=True))
