"""Reading taming VQGAN files safely: what a real checkpoint holds loads, nothing more.

The fixture checkpoint (tests/fixtures/vqgan, written by taming-transformers 0.0.1 in the
layout of its pytorch-lightning 1.0.8 training) keys its callback state by the
ModelCheckpoint *class*, as Lightning 1.x did; loading it at all proves the allow-list
covers that (tests/model/test_vqgan.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from dalle_dist.checkpoint.taming import (
    TamingConfig,
    load_vqgan,
    read_taming_state_dict,
    read_vqgan_config,
)
from dalle_dist.errors import CheckpointError, ConfigError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vqgan"
CKPT, YAML = FIXTURE / "tiny_vqgan.ckpt", FIXTURE / "tiny_vqgan.yaml"


def _fixture_checkpoint() -> dict:
    """The fixture's payload, read the way we read it (no Lightning needed)."""
    from dalle_dist.checkpoint.taming import _lightning_globals

    with _lightning_globals():
        return torch.load(CKPT, weights_only=True)


def test_loss_weights_are_dropped_and_the_rest_kept() -> None:
    """Fails if loss.* (discriminator) entries reached the model or weights were lost."""
    full = _fixture_checkpoint()["state_dict"]
    assert any(k.startswith("loss.") for k in full), "the fixture holds a real loss"
    state = read_taming_state_dict(CKPT)
    assert set(state) == {k for k in full if not k.startswith("loss.")}


def test_a_checkpoint_with_other_pickled_objects_is_refused(tmp_path: Path) -> None:
    """An old Lightning checkpoint whose hparams are an argparse.Namespace, a global no
    taming checkpoint holds: refused unread. Fails if the allow-list admits more than
    the Lightning callback key and numpy's scalar and dtype (e.g. weights_only=False)."""
    payload = _fixture_checkpoint()
    payload["hparams"] = argparse.Namespace(lr=1e-4)
    del payload["callbacks"]  # our stand-in class cannot be pickled under the real name
    torch.save(payload, tmp_path / "hparams.ckpt")
    with pytest.raises(CheckpointError, match="carries pickled Python objects"):
        read_taming_state_dict(tmp_path / "hparams.ckpt")


def test_yaml_is_read_as_plain_data(tmp_path: Path) -> None:
    """A YAML tag that builds a Python object is refused; fails with yaml.unsafe_load (or
    yaml.load with the full loader), which would build it (here, a harmless int)."""
    text = YAML.read_text().replace("embed_dim: 4", 'embed_dim: !!python/object/apply:int ["4"]')
    (tmp_path / "evil.yaml").write_text(text)
    with pytest.raises(ConfigError, match="not readable YAML"):
        read_vqgan_config(tmp_path / "evil.yaml")


@pytest.mark.parametrize("edit, error, fragment", [
    (("n_embed: 32", "n_embed: 64"), CheckpointError, "does not match --vqgan_config_path"),
    (("target: taming.models.vqgan.VQModel", "target: taming.models.vqgan.GumbelVQ"),
     ConfigError, "only taming.models.vqgan.VQModel"),
    (("    ddconfig:", "    ddconfigs:"), ConfigError, "no model.params.ddconfig"),
])
def test_config_that_does_not_fit_is_refused(tmp_path: Path, edit: tuple, error: type,
                                             fragment: str) -> None:
    """Fails if a codebook of another size loaded partially (strict names and shapes),
    or a Gumbel VQGAN were read as a plain one."""
    (tmp_path / "model.yaml").write_text(YAML.read_text().replace(*edit))
    with pytest.raises(error, match=fragment):
        load_vqgan(CKPT, tmp_path / "model.yaml")


def test_flags_need_both_paths() -> None:
    """--taming alone names both flags (nothing is downloaded); one path names the other."""
    with pytest.raises(ConfigError, match="--vqgan_model_path and --vqgan_config_path"):
        TamingConfig(taming=True).validate()
    with pytest.raises(ConfigError, match="--vqgan_model_path needs --vqgan_config_path"):
        TamingConfig(vqgan_model_path="x.ckpt").validate()
    assert TamingConfig(vqgan_model_path="a", vqgan_config_path="b").wanted
    assert not TamingConfig().wanted


def test_flags_beside_a_dalle_checkpoint_must_name_its_vqgan(tmp_path: Path) -> None:
    """generate / a resumed train: the checkpoint's own VQGAN passes, anything else is
    refused. Fails if --taming alone were accepted silently, if a VAE-trained checkpoint
    took VQGAN flags, or if another config passed for the carried one."""
    from dalle_dist.checkpoint.taming import check_carried_vqgan, file_sha256

    carried = read_vqgan_config(YAML, source_sha256=file_sha256(CKPT)).to_dict()
    same = TamingConfig(vqgan_model_path=str(CKPT), vqgan_config_path=str(YAML))
    check_carried_vqgan(carried, same, "--dalle_path", "d.pt")
    check_carried_vqgan(carried, TamingConfig(), "--dalle_path", "d.pt")  # no flags: fine
    with pytest.raises(ConfigError, match="carries its VQGAN: drop --taming"):
        check_carried_vqgan(carried, TamingConfig(taming=True), "--dalle_path", "d.pt")
    with pytest.raises(ConfigError, match="trained on a dalle-dist VAE"):
        check_carried_vqgan({"image_size": 32}, same, "--dalle_path", "d.pt")
    (tmp_path / "other.yaml").write_text(YAML.read_text().replace("n_embed: 32", "n_embed: 64"))
    other = TamingConfig(vqgan_model_path=str(CKPT), vqgan_config_path=str(tmp_path / "other.yaml"))
    with pytest.raises(ConfigError, match="describes another VQGAN"):
        check_carried_vqgan(carried, other, "--dalle_path", "d.pt")


def test_numpy_scores_load_and_numpy_arrays_do_not(tmp_path: Path) -> None:
    """Lightning 1.x callback state of CompVis models can hold numpy scalars (a score
    logged as numpy): they load. An array needs numpy's reconstruct, which no checkpoint
    of a taming model holds: refused. Fails if the dtype classes were left off the
    allow-list (numpy >= 1.25 unpickles a dtype onto its own class) or arrays admitted."""
    import numpy as np

    state = read_taming_state_dict(CKPT)
    torch.save({"state_dict": state, "callbacks": {"ModelCheckpoint": {
        "best_model_score": np.float64(0.25), "current_score": np.float32(0.5)}}},
        tmp_path / "scores.ckpt")
    assert set(read_taming_state_dict(tmp_path / "scores.ckpt")) == set(state)
    torch.save({"state_dict": state, "extra": np.zeros(3)}, tmp_path / "array.ckpt")
    with pytest.raises(CheckpointError, match="carries pickled Python objects"):
        read_taming_state_dict(tmp_path / "array.ckpt")
