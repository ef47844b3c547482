"""A DALLE-pytorch 1.6.6 dalle.pt, imported with the CLI, trains on: one process, then 2
torchrun ranks under torch DDP and under FSDP2, from the file's weights and its Adam
state, on the built-in data with no other flag; every run ends where the one-process run
does, and the imported model samples, plans and verifies.

Bugs it fails on: the imported optimizer state dropped on a backend (its first step then
moves the weights by a fresh Adam's full lr: the runs part by ~1e-3), a weight loaded into
the wrong place on one backend, `plan` or `generate` refusing an imported file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests import launch
from tests.backends.runs import assert_ranks_consistent
from tests.checkpoint.dalle_pytorch_reference import dalle_pytorch, saved_like_train_dalle
from tests.conftest import run_cli

#: their model on the built-in data: 32 px shapes, byte captions (257 ids) of 48
HPARAMS = {"num_text_tokens": 257, "text_seq_len": 48, "dim": 32, "depth": 2, "heads": 2,
           "dim_head": 12, "reversible": False, "loss_img_weight": 7,
           "attn_types": ("full", "axial_row"), "ff_dropout": 0.0, "attn_dropout": 0.0,
           "stable": False, "shift_tokens": True, "rotary_emb": True,
           "shared_attn_ids": None, "shared_ff_ids": None, "share_input_output_emb": False}
VAE_PARAMS = {"image_size": 32, "num_layers": 2, "num_tokens": 64, "codebook_dim": 24,
              "hidden_dim": 16, "num_resnet_blocks": 1}
TRAIN = ["--epochs", "1", "--shapes_count", "64", "--batch_size", "16",
         "--fidelity_images", "4"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dp = dalle_pytorch()
    torch.manual_seed(0)
    theirs = dp.DALLE(vae=dp.DiscreteVAE(**VAE_PARAMS), **HPARAMS)
    opt = torch.optim.Adam([p for p in theirs.parameters() if p.requires_grad], lr=3e-4)
    text = torch.randint(1, 257, (4, 48))
    theirs(text, torch.randint(0, 64, (4, 64)), return_loss=True).backward()
    opt.step()
    folder = tmp_path_factory.mktemp("from_dalle_pytorch")
    torch.save(saved_like_train_dalle(theirs, HPARAMS, VAE_PARAMS, opt), folder / "dalle.pt")
    result = run_cli("checkpoint", "import", str(folder / "dalle.pt"),
                     str(folder / "imported.pt"))
    assert result.returncode == 0, result.stderr
    assert "Adam state" in result.stdout, result.stdout
    return folder / "imported.pt"


def _weights(path: Path) -> dict[str, torch.Tensor]:
    """A run's saved weights: NAME.pt, or under fsdp (sharded saves) NAME-sharded/."""
    from dalle_dist.checkpoint.load import read_any_checkpoint

    sharded = path.with_name(path.stem + "-sharded")
    return read_any_checkpoint(sharded if sharded.exists() else path, "test")["weights"]


def test_imported_model_trains_on_every_launch_alike(imported: Path, tmp_path: Path) -> None:
    one = tmp_path / "one" / "dalle"
    result = run_cli("train", "--dalle_path", str(imported), *TRAIN,
                     "--dalle_output_file_name", str(one))
    assert result.returncode == 0, result.stderr
    reference = _weights(one.with_suffix(".pt"))
    start = _weights(imported)
    moved = max((reference[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-4  # it trained
    # the file's Adam state is what the run continued with: without it, it ends elsewhere
    fresh, fresh_out = tmp_path / "no_adam.pt", tmp_path / "fresh" / "dalle"
    torch.save({**torch.load(imported, weights_only=True), "optimizer": None}, fresh)
    result = run_cli("train", "--dalle_path", str(fresh), *TRAIN,
                     "--dalle_output_file_name", str(fresh_out))
    assert result.returncode == 0, result.stderr
    apart = _weights(fresh_out.with_suffix(".pt"))
    assert max((apart[k] - reference[k]).abs().max().item() for k in reference) > 1e-4
    for backend in ("torch", "fsdp"):
        out = tmp_path / backend / "dalle"
        result = launch.torchrun("train", "--dalle_path", str(imported), *TRAIN,
                                 "--distributed_backend", backend,
                                 "--dalle_output_file_name", str(out))
        assert result.returncode == 0, launch.output(result)
        assert_ranks_consistent(backend, launch.output(result))
        got = _weights(out.with_suffix(".pt"))
        for key, value in reference.items():
            torch.testing.assert_close(got[key], value, rtol=1e-4, atol=2e-6,
                                       msg=lambda m, k=key, b=backend: f"{b} {k}: {m}")
    result = run_cli("generate", "--dalle_path", str(tmp_path / "torch" / "dalle.pt"),
                     "--text", "a red circle", "--num_images", "2", "--outputs_dir",
                     str(tmp_path / "gen"))
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "gen").rglob("*.png"))) >= 2


def test_imported_file_is_a_checkpoint_like_any(imported: Path, tmp_path: Path) -> None:
    """generate, verify, inspect, export and plan take the imported file itself, and read
    what it holds: the images are drawn, verify counts its weights, inspect shows the
    imported architecture, the export holds its very weights, plan sizes its model."""
    from dalle_dist.checkpoint.export import load_exported

    weights = _weights(imported)
    counted = sum(t.numel() for t in weights.values())  # no shared modules
    result = run_cli("generate", "--dalle_path", str(imported), "--text", "a blue square",
                     "--num_images", "1", "--outputs_dir", str(tmp_path / "gen"))
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "gen").rglob("*.png"))
    result = run_cli("checkpoint", "verify", str(imported))
    assert result.returncode == 0 and f"dalle {counted:,}" in result.stdout, result.stdout
    result = run_cli("checkpoint", "inspect", str(imported), "--json")
    assert result.returncode == 0 and '"layer_scale": true' in result.stdout, result.stdout
    result = run_cli("checkpoint", "export", str(imported), str(tmp_path / "exp"))
    assert result.returncode == 0, result.stderr
    exported = load_exported(tmp_path / "exp")["weights"]
    assert exported.keys() == weights.keys()
    assert all(torch.equal(exported[k], v) for k, v in weights.items())
    result = run_cli("plan", "--dalle_path", str(imported), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["parameters"]["dalle"] == counted
