"""The input side of a step on CUDA, proven on CPU: TF32, pinned worker loading (and
captions nulled in pinned memory), and the frozen VAE encoding in the run's precision.

No GPU is needed: the TF32 switches are process-wide torch settings that read back on a
CPU build, and a `cuda` device object builds a loader without touching a GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from dalle_dist.backends import SingleBackend
from dalle_dist.backends.precision import Precision, matmul_dtypes
from dalle_dist.cli import build_parser
from dalle_dist.cli.parser import subcommand_parser
from dalle_dist.data import CaptionCollate, DataConfig, ShapesDataset
from dalle_dist.data.loader import default_num_workers
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.train.commands import loader_workers, rank_loader, set_tf32
from dalle_dist.train.config import TrainConfig
from dalle_dist.train.dalle_task import DALLETask, null_captions
from dalle_dist.train.run_log import RunLog

CPU = torch.device("cpu")


@pytest.fixture
def tf32_settings() -> Iterator[None]:
    """Put the process-wide switches back as they were, for the tests that follow."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


def _tf32() -> tuple[str, bool]:
    return torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32


def test_tf32_is_on_for_cuda_unless_turned_off(tf32_settings: None) -> None:
    """Seen failing with cuDNN left alone on --no_tf32 (its default is already TF32)."""
    torch.set_float32_matmul_precision("highest")
    assert set_tf32(torch.device("cuda", 0), True)
    assert _tf32() == ("high", True)
    assert not set_tf32(torch.device("cuda"), False)
    assert _tf32() == ("highest", False)


def test_tf32_is_left_alone_on_cpu(tf32_settings: None) -> None:
    """On CPU the process's settings are not ours to change (and mean nothing there)."""
    for before in (("highest", False), ("high", True)):
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
        for enabled in (True, False):
            assert not set_tf32(CPU, enabled)
            assert _tf32() == before


def test_no_tf32_is_a_training_flag_off_by_default() -> None:
    parser = build_parser()
    for command in ("train", "train-vae"):
        sub = subcommand_parser(parser, command)
        assert sub is not None
        assert sub.parse_args([]).no_tf32 is False
        assert sub.parse_args(["--no_tf32"]).no_tf32 is True
    assert not hasattr(subcommand_parser(parser, "plan").parse_args([]), "no_tf32")


def _loader(device: str, data: DataConfig) -> tuple[int, bool]:
    backend = SingleBackend.on(torch.device(device))
    workers = loader_workers(data, backend)
    loader = rank_loader(data, 16, TrainConfig(batch_size=8), backend,
                         CaptionCollate(None, 0, False), False, RunLog(None, False),
                         workers=workers)
    return loader.loader.num_workers, loader.loader.pin_memory


def test_cuda_runs_load_in_pinned_workers_by_default() -> None:
    """Seen failing with pin_memory left off: then the step's non_blocking copies wait."""
    data = DataConfig(shapes_count=32)
    assert _loader("cuda", data) == (default_num_workers(torch.device("cuda"), 1), True)
    assert _loader("cpu", data) == (0, False)
    assert _loader("cpu", DataConfig(shapes_count=32, num_workers=2)) == (2, False)
    assert _loader("cuda", DataConfig(shapes_count=32, num_workers=0)) == (0, True)


def test_null_captions_keep_a_pinned_batch_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader pins captions on CUDA; --null_cond_prob's product must land in pinned
    memory too, or the step's non_blocking copy of it runs synchronously (seen: a pageable
    `text * mask`). Pinning needs an accelerator: with one, a pinned batch is checked;
    without (torch refuses to pin), that pinned memory is asked for. The values are those
    of the CPU RNG's draw either way."""
    text = torch.randint(1, 50, (64, 8))
    torch.manual_seed(3)
    expected = text * (torch.rand(64) >= 0.5).unsqueeze(1)
    torch.manual_seed(3)
    if torch.cuda.is_available():
        nulled = null_captions(text.pin_memory(), 0.5)
        assert nulled.is_pinned()
    else:
        asked: list[bool] = []
        empty_like = torch.empty_like

        def pinned_request(like: torch.Tensor, **kwargs: bool) -> torch.Tensor:
            asked.append(kwargs.get("pin_memory", False))
            return empty_like(like, **{**kwargs, "pin_memory": False})

        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)  # as the loader's
        monkeypatch.setattr(torch, "empty_like", pinned_request)
        nulled = null_captions(text, 0.5)
        assert asked == [True]
    assert torch.equal(nulled, expected)


def _task(vae: DiscreteVAE, precision: str) -> DALLETask:
    cfg = DALLEConfig(num_text_tokens=ByteTokenizer().vocab_size, text_seq_len=16,
                      num_image_tokens=vae.config.num_tokens,
                      image_fmap_size=vae.config.fmap_size, dim=32, depth=1, heads=2,
                      dim_head=16)
    return DALLETask(cfg, copy.deepcopy(vae), ByteTokenizer(), TrainConfig(), {}, False, CPU,
                     precision=Precision(precision, CPU))


def test_the_frozen_vae_encodes_in_the_runs_precision() -> None:
    """bf16 runs encode in bf16, and the tokens are fp32's wherever fp32's best code leads
    the runner-up by more than bf16 can move a logit (8 mantissa bits: 2% of the logit
    range is well clear). Seen failing with the encoding outside autocast (its convs ran
    in float32). Built-in shapes through a seeded VAE; the agreement over all positions
    is printed (the trained built-in VAE agrees on 99.5% of 256 x 64 positions)."""
    torch.manual_seed(0)
    vae = DiscreteVAE(VAEConfig(image_size=32)).eval()
    shapes = ShapesDataset(64, 32, seed=777)
    batch = CaptionCollate(ByteTokenizer(), 16, True)([shapes[i] for i in range(64)])

    tokens = {}
    for precision in ("fp32", "bf16"):
        task = _task(vae, precision)
        with matmul_dtypes(task.vae) as seen:
            text, tokens[precision] = task.inputs(batch, CPU)
        assert seen == {torch.float32 if precision == "fp32" else torch.bfloat16}
        assert not tokens[precision].requires_grad and text.dtype == torch.long

    with torch.no_grad():
        logits = vae.encoder(vae._normalize(batch[0])).flatten(2)  # [b, codes, positions]
    best, runner_up = logits.topk(2, dim=1).values.unbind(1)
    clear = (best - runner_up) > 0.02 * (logits.max() - logits.min())
    agree = tokens["fp32"] == tokens["bf16"]
    print(f"bf16 tokens agree with fp32 on {agree.float().mean():.4f} of {agree.numel()} "
          f"positions; {clear.float().mean():.3f} are clear and agree on {agree[clear].all()}")
    assert clear.float().mean() > 0.5, "the check must cover most positions"
    assert agree[clear].all()
    assert agree.float().mean() > 0.95
