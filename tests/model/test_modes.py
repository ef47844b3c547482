"""eval_mode: the one way sampling, sample grids and validation switch a model to eval."""

from __future__ import annotations

import pytest
from torch import nn

from dalle_dist.model.modes import eval_mode


def test_eval_inside_then_the_mode_it_was_in_even_after_an_exception() -> None:
    """Bugs: restoring with train() (an eval model comes back training), restoring only
    on success (a sampler that raised mid-training leaves dropout off for the rest of the
    run), switching only the top module."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    with eval_mode(model):
        assert not model.training and not model[1].training
    assert model.training and model[1].training
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError("sampling failed")
    assert model.training and model[1].training
    model.eval()
    with eval_mode(model):
        pass
    assert not model.training and not model[1].training
