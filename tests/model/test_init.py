"""model/init.py: a meta-built model's initial weights as a stream (docs/design.md,
"Construction").

The 2-rank launches prove the stream gives FSDP shards and ZeRO-3 partitions the one-process
run's weights (tests/backends/test_equivalence.py: step 1's loss and gradient norm); these
check the stream itself, in-process.

Seen failing: initial_weights drawing from the global RNG (generator=None) fails
test_initial_weights_are_seeded_and_leave_the_global_rng (the RNG state moved, so a run's
dropout would depend on how its model was built); a LayerNorm weight filled like a bias
fails test_every_parameter_gets_its_kinds_value.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.init import (
    HEAD_ELEMENTS,
    INIT_STD,
    checkpoint_weights,
    initial_weights,
    materialise,
    on_meta,
    owned_parameters,
    with_heads,
)
from dalle_dist.model.transformer import LayerScale

CONFIG = DALLEConfig(num_text_tokens=100, text_seq_len=8, num_image_tokens=64,
                     image_fmap_size=4, dim=64, depth=4, heads=2, dim_head=16,
                     attn_types=("full", "axial_row"), rotary_emb=True, shift_tokens=True,
                     share_input_output_emb=True, shared_attn_ids=("a", "b", "a", "b"),
                     shared_ff_ids=("f", "f", "g", "g"))


def built(seed: int) -> DALLE:
    model = on_meta(lambda: DALLE(CONFIG))
    assert all(p.is_meta for p in model.parameters())
    return materialise(model, initial_weights(model, seed))


def test_initial_weights_are_seeded_and_leave_the_global_rng() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first, again, other = built(7).state_dict(), built(7).state_dict(), built(8).state_dict()
    assert torch.equal(torch.get_rng_state(), state), "the global RNG was drawn from"
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["to_logits.weight"], other["to_logits.weight"])


def test_every_parameter_gets_its_kinds_value() -> None:
    model = built(0)
    kinds = set()
    for name, owner, own in owned_parameters(model):
        value = getattr(owner, own).detach()
        kinds.add((type(owner).__name__, own))
        if isinstance(owner, (nn.Linear, nn.Embedding)) and own == "weight":
            assert abs(value.std().item() - INIT_STD) < 0.1 * INIT_STD, name
            assert abs(value.mean().item()) < 0.1 * INIT_STD, name
        elif isinstance(owner, nn.LayerNorm) and own == "weight":
            assert torch.equal(value, torch.ones_like(value)), name
        else:
            assert torch.equal(value, torch.zeros_like(value)), name
    assert kinds == {("Linear", "weight"), ("Linear", "bias"), ("LayerNorm", "weight"),
                     ("LayerNorm", "bias")}
    # shared layers and tied embeddings keep one parameter each
    assert model.transformer.blocks[0].attn is model.transformer.blocks[2].attn
    assert len(owned_parameters(model)) == len(list(model.parameters()))


def test_a_module_the_rule_does_not_know_is_refused() -> None:
    model = on_meta(lambda: nn.Sequential(nn.Linear(4, 4), nn.Conv2d(1, 1, 3)))
    with pytest.raises(TypeError, match=r"Conv2d\.weight"):
        materialise(model, initial_weights(model, 0))


def test_checkpoint_weights_must_fit_the_model() -> None:
    source = built(1).state_dict()
    model = on_meta(lambda: DALLE(CONFIG))
    loaded = materialise(model, checkpoint_weights(model, source)).state_dict()
    assert all(torch.equal(loaded[k], source[k]) for k in source)
    source.pop("to_logits.bias")
    with pytest.raises(RuntimeError, match=re.escape("missing ['to_logits.bias']")):
        checkpoint_weights(on_meta(lambda: DALLE(CONFIG)), source)


def test_with_heads_keeps_the_bytes_of_each_values_first_elements() -> None:
    model = on_meta(lambda: DALLE(CONFIG))
    heads: dict[str, bytes] = {}
    values = dict(with_heads(initial_weights(model, 0), heads))
    assert heads.keys() == values.keys()
    for name, head in heads.items():
        first = values[name].reshape(-1)[:HEAD_ELEMENTS]
        assert len(head) == 4 * min(HEAD_ELEMENTS, values[name].numel())
        assert torch.equal(torch.frombuffer(bytearray(head), dtype=torch.float32), first)


def test_a_module_with_buffers_cannot_be_filled_from_meta() -> None:
    model = on_meta(lambda: nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="buffers"):
        materialise(model, iter([]))


def test_a_directly_built_model_fills_every_parameter() -> None:
    """DALLE(config) outside a training run (a test, a script, an imported DALLE-pytorch
    1.x layout before its weights load) draws its values at construction. Bug caught:
    LayerScale's vector left as torch.empty allocated it (its gradients came out NaN)
    while every other parameter was filled."""
    config = DALLEConfig(num_text_tokens=100, text_seq_len=8, num_image_tokens=64,
                         image_fmap_size=4, dim=64, depth=2, heads=2, dim_head=16,
                         layer_scale=True)
    torch.manual_seed(0)
    model = DALLE(config)
    scales = [module for module in model.modules() if isinstance(module, LayerScale)]
    assert len(scales) == 2 * config.depth
    for module in scales:
        assert torch.equal(module.scale, torch.full_like(module.scale, module.initial))
    model(torch.randint(1, 100, (2, 8)), torch.randint(0, 64, (2, 16)))["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
