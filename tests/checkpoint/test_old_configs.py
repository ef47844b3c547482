"""Checkpoints written before a model option existed (--rotary_emb, --shift_tokens): their
config has no such key, they load with the option off, and a resumed run refuses to turn
it on for them instead of ignoring the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dalle_dist.checkpoint.resume import check_flags_agree
from dalle_dist.errors import ConfigError
from dalle_dist.generate import load_sampler

NEW_FIELDS = ("rotary_emb", "shift_tokens")


def test_checkpoint_without_the_option_fields_loads_with_them_off(
        tiny_dalle: Path, tmp_path: Path) -> None:
    """`train`'s checkpoint, with the two keys removed as an older version wrote it, loads
    through generate's loader (strict weights) with learned positions, as it was trained.
    Bug (seen failing): --rotary_emb defaulting on, as DALLE-pytorch's class does (then
    old weights hold position embeddings the model no longer has; the run seen failing
    stopped earlier, at `train` recording the option on)."""
    payload = torch.load(tiny_dalle, weights_only=True)
    model_config = payload["configs"]["model"]
    assert {model_config[k] for k in NEW_FIELDS} == {False}  # new checkpoints record them
    old = {**payload, "configs": {**payload["configs"], "model": {
        k: v for k, v in model_config.items() if k not in NEW_FIELDS}}}
    torch.save(old, tmp_path / "old.pt")
    sampler = load_sampler(tmp_path / "old.pt", torch.device("cpu"))
    config = sampler.model.config
    assert not config.rotary_emb and not config.shift_tokens
    assert sampler.model.text_pos_emb is not None
    weights = sampler.model.state_dict()  # loaded strictly: every key, no extra
    assert all(torch.equal(weights[k], v) for k, v in payload["weights"].items())


def test_resume_refuses_an_option_the_checkpoint_predates() -> None:
    """--rotary_emb given to resume a checkpoint that does not record it: that model has it
    off, so the flag contradicts it (an error, not a silently ignored flag); the off value
    agrees. Bug (seen failing): keys missing from the checkpoint's config skipped."""
    saved = {"dim": 32, "depth": 2}
    with pytest.raises(ConfigError, match=r"rotary_emb True \(checkpoint: not recorded: off\)"):
        check_flags_agree({"rotary_emb": True, "dim": 32}, saved, "old.pt")
    check_flags_agree({"rotary_emb": False, "shift_tokens": False, "dim": 32}, saved, "old.pt")
    with pytest.raises(ConfigError, match=r"dim 64 \(checkpoint: 32\)"):
        check_flags_agree({"dim": 64}, saved, "old.pt")
