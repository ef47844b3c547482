"""--ema_decay: when the average updates, the refusals, the swap that samples and validates
with it, and what `generate`, `checkpoint export` and a resume do with a checkpoint's EMA.

The average itself is checked against a hand-computed one and across all five backends in
tests/backends/test_equivalence.py, through sharded and DeepSpeed saves in
tests/backends/test_sharded_checkpoints.py and test_ds_resharding.py, and bit for bit
across a resume in tests/train/test_resume.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from dalle_dist.backends.ema import EMA, EMAEntry, EMASettings
from dalle_dist.checkpoint.tools import choose_weights
from dalle_dist.errors import CheckpointError
from tests.backends import runs
from tests.backends.runs import Run
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli


def test_updates_copy_up_to_the_start_then_every_kth_step() -> None:
    settings = EMASettings(0.9, start_step=3, every=2)
    assert [settings.updates_at(k) for k in range(1, 9)] == [
        "copy", "copy", "copy", None, "average", None, "average", None]
    assert [EMASettings(0.9).updates_at(k) for k in (1, 2)] == ["average", "average"]


def test_the_average_is_lerp_towards_the_weights_and_applied_restores_them() -> None:
    """Two averaging updates of a bf16 parameter (a 16-bit module, as under DeepSpeed bf16)
    in fp32, then the swap: inside, the parameter holds the average (rounded to bf16);
    after, its own values bit for bit. Caught: an average kept in the parameter's dtype,
    a swap that leaves the average behind."""
    param = nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    ema = EMA(EMASettings(0.5), [EMAEntry("w", param.shape)], lambda: [param])
    assert ema.shadow[0].dtype == torch.float32
    with torch.no_grad():
        param.fill_(1.0)
        ema.update(1)
        param.fill_(3.0)
        ema.update(2)
    assert torch.equal(ema.shadow[0], torch.full((4,), 0.5 * 0.5 + 0.5 * 3.0))
    with ema.applied():
        assert torch.equal(param.detach(), torch.full((4,), 1.75, dtype=torch.bfloat16))
    assert torch.equal(param.detach(), torch.full((4,), 3.0, dtype=torch.bfloat16))
    assert ema.full_state(is_root=True)["w"].dtype == torch.float32


@pytest.mark.parametrize(("flags", "message"), [
    (("--ema_decay", "1"), "--ema_decay must be in (0, 1), got 1"),
    (("--ema_every", "4"), "--ema_start_step and --ema_every need --ema_decay"),
    (("--ema_decay", "0.99", "--ema_every", "0"), "--ema_every must be >= 1, got 0"),
])
def test_bad_ema_flags_are_refused_before_anything_runs(flags: tuple[str, ...], message: str,
                                                        tmp_path: Path) -> None:
    result = run_cli("train", *TINY_DALLE_FLAGS, *flags, "--dalle_output_file_name", "d",
                     cwd=tmp_path)
    assert_user_error(result, message)
    assert not any(tmp_path.iterdir()), "nothing written"


def grid(folder: Path) -> np.ndarray:
    [path] = folder.glob("*/grid.png")
    return np.asarray(Image.open(path), dtype=np.int16)


def test_generate_samples_from_the_ema_unless_told_otherwise(trained: Callable[..., Run],
                                                             tmp_path: Path) -> None:
    """The same seed from one checkpoint: the EMA's images are not the trained weights'
    (--no_ema), and the line says which it took. Caught: generate ignoring ema_weights."""
    checkpoint = trained("single", "fp32").folder / "dalle.pt"
    args = ("generate", "--dalle_path", str(checkpoint), "--text", "a red circle",
            "--num_images", "4", "--batch_size", "4", "--seed", "3", "--top_k", "0")
    ema = run_cli(*args, "--outputs_dir", "ema", cwd=tmp_path)
    raw = run_cli(*args, "--outputs_dir", "raw", "--no_ema", cwd=tmp_path)
    assert ema.returncode == 0 and raw.returncode == 0, ema.stderr + raw.stderr
    assert "sampling from the checkpoint's EMA weights" in ema.stdout
    assert "EMA" not in raw.stdout
    assert not np.array_equal(grid(tmp_path / "ema"), grid(tmp_path / "raw"))


def test_export_writes_either_set(trained: Callable[..., Run], tmp_path: Path) -> None:
    """--weights auto takes the EMA, trained the weights, and the JSON says which; a
    checkpoint without an EMA refuses --weights ema in one line."""
    from safetensors.torch import load_file

    run = trained("single", "fp32")
    source = run.folder / "dalle.pt"
    for choice in ("auto", "trained"):
        result = run_cli("checkpoint", "export", str(source), str(tmp_path / choice),
                         "--weights", choice)
        assert result.returncode == 0, result.stderr
    exported = {c: load_file(tmp_path / f"{c}.safetensors") for c in ("auto", "trained")}
    name = "transformer.blocks.0.attn.to_qkv.weight"
    assert torch.equal(exported["auto"][f"dalle.{name}"], run.payload["ema_weights"][name])
    assert torch.equal(exported["trained"][f"dalle.{name}"], run.payload["weights"][name])
    assert json.loads((tmp_path / "auto.json").read_text())["weights"] == "ema"
    no_ema = {**run.payload, "ema_weights": None}
    with pytest.raises(CheckpointError, match="holds no EMA weights"):
        choose_weights(no_ema, "ema", "PATH x")


def test_shared_layers_take_the_ema_under_every_name(tiny_vae: Path, tmp_path: Path) -> None:
    """A module shared by two layers is one parameter, which the EMA holds under its first
    name: the chosen weights give it under both (load_state_dict takes the last)."""
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--depth", "2",
                     "--shared_attn_ids", "a,a", "--epochs", "1", "--batch_size", "16",
                     "--shapes_count", "32", "--fidelity_images", "0", "--ema_decay", "0.5",
                     "--dalle_output_file_name", "d", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = torch.load(tmp_path / "d.pt", weights_only=True)
    chosen, which = choose_weights(payload, "auto", "d.pt")
    first, second = ("transformer.blocks.0.attn.to_qkv.weight",
                     "transformer.blocks.1.attn.to_qkv.weight")
    assert which == "ema" and second not in payload["ema_weights"]
    assert torch.equal(chosen["weights"][second], payload["ema_weights"][first])
    assert not torch.equal(chosen["weights"][second], payload["weights"][second])


def test_resuming_without_the_flag_says_the_ema_is_dropped(trained: Callable[..., Run],
                                                           tiny_dalle: Path,
                                                           tmp_path: Path) -> None:
    """Both mismatches go on, each with a line: a checkpoint's EMA that the run will not
    keep, and an EMA asked of a checkpoint that holds none (started from its weights)."""
    ema = trained("single", "fp32").folder / "dalle.pt"
    ema_flags = len(runs.EMA)  # COMMON without them: the run that trained `ema`, less EMA
    assert runs.COMMON[-ema_flags:] == list(runs.EMA)
    dropped = run_cli("train", "--resume", str(ema), *runs.COMMON[:-ema_flags],
                      "--batch_size", str(runs.BATCH), "--dalle_output_file_name", "a",
                      cwd=tmp_path)
    assert dropped.returncode == 0, dropped.stderr[-3000:]
    assert "the checkpoint keeps EMA weights (--ema_decay 0.6) and this run has no " \
           "--ema_decay" in dropped.stdout + dropped.stderr
    started = run_cli("train", "--dalle_path", str(tiny_dalle), *TINY_DALLE_FLAGS, "--epochs",
                      "1", "--fidelity_images", "0", "--ema_decay", "0.9",
                      "--dalle_output_file_name", "b", cwd=tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "holds no EMA weights: the average starts from its weights" in started.stdout
