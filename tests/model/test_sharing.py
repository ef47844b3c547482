"""--shared_attn_ids / --shared_ff_ids, --share_input_output_emb and --activation_checkpointing
(--reversible) on the model itself; every backend trains them in
tests/backends/test_sharing.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dalle_dist import plan
from dalle_dist.errors import ConfigError
from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.train.optim import make_adam
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli


def config(**overrides: object) -> DALLEConfig:
    values: dict = dict(num_text_tokens=50, text_seq_len=8, num_image_tokens=16,
                        image_fmap_size=4, dim=32, depth=4, heads=2, dim_head=16)
    return DALLEConfig(**{**values, **overrides})


def batch(c: DALLEConfig, n: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, c.num_text_tokens, (n, c.text_seq_len), generator=g)
    text[:, -2:] = 0  # padding
    return text, torch.randint(0, c.num_image_tokens, (n, c.image_seq_len), generator=g)


SHARED = dict(shared_attn_ids=("a", "b", "a", "c"), shared_ff_ids=("0", "1", "1", "2"),
              share_input_output_emb=True, attn_types=("full", "axial_row"))


# -- activation checkpointing --------------------------------------------------------

def saved_tensor_count(model: DALLE, c: DALLEConfig) -> int:
    """Tensors autograd keeps outside checkpointed regions for one forward."""
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*batch(c))
    return count


def test_checkpointing_gives_the_unchecked_gradients_and_parameters() -> None:
    """Same loss and gradients (bit for bit) with dropout on, and the same parameters after
    three Adam steps, while autograd keeps fewer tensors. Caught when broken: the
    checkpoint without preserve_rng_state (dropout masks redrawn in the recomputation:
    gradients differ); checkpointing never switched on (the saved-tensor count is equal)."""
    c = config(attn_dropout=0.1, ff_dropout=0.1, **SHARED)
    torch.manual_seed(0)
    plain = DALLE(c)
    checked = DALLE(c)
    checked.load_state_dict(plain.state_dict())
    checked.transformer.set_checkpointing(True)
    assert saved_tensor_count(checked, c) < saved_tensor_count(plain, c) // 2
    optimizers = [make_adam(m.parameters(), 1e-3) for m in (plain, checked)]
    for step in range(3):
        grads = []
        for model, optimizer in zip((plain, checked), optimizers, strict=True):
            torch.manual_seed(100 + step)  # the same dropout masks for both
            loss = model(*batch(c, seed=step))["loss"]
            loss.backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            optimizer.step()
            optimizer.zero_grad()
        assert grads[0].keys() == grads[1].keys()
        for name, grad in grads[0].items():
            assert torch.equal(grad, grads[1][name]), (step, name)
    for (name, a), b in zip(plain.state_dict().items(), checked.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name


def test_checkpointing_is_off_when_sampling() -> None:
    """The KV-cached decode and no-grad passes never go through the checkpoint (it would
    only cost time there): cached sampling still equals uncached, token for token."""
    c = config(**SHARED)
    torch.manual_seed(0)
    model = DALLE(c)
    model.transformer.set_checkpointing(True)
    text, _ = batch(c)
    cached = model.sample_image_tokens(text, generator=torch.Generator().manual_seed(1))
    uncached = model.sample_image_tokens(text, generator=torch.Generator().manual_seed(1),
                                         use_cache=False)
    assert torch.equal(cached, uncached)


# -- shared layers and tied embeddings -------------------------------------------------

def test_shared_layers_hold_one_module_counted_once() -> None:
    """Caught when broken: blocks building their own modules (no `is`), the plan counting a
    shared parameter per layer, FSDP units splitting a shared module."""
    c = config(**SHARED)
    model = DALLE(c)
    blocks = model.transformer.blocks
    assert blocks[0].attn is blocks[2].attn and blocks[1].attn is not blocks[0].attn
    assert blocks[1].ff is blocks[2].ff and blocks[0].ff is not blocks[1].ff
    assert blocks[0].attn_norm is not blocks[2].attn_norm  # norms stay per layer
    unique = sum(p.numel() for p in model.parameters())
    assert plan.dalle_parameters(c) == unique
    plain = sum(p.numel() for p in DALLE(config(attn_types=("full", "axial_row"))).parameters())
    attn = sum(p.numel() for p in blocks[0].attn.parameters())
    ff = sum(p.numel() for p in blocks[0].ff.parameters())
    emb = (c.num_text_tokens + c.text_seq_len + c.num_image_tokens) * c.dim
    assert unique == plain - attn - ff - emb
    # blocks 0-2 are linked (attention 0~2, feed-forward 1~2): one FSDP unit; 3 alone
    groups = model.transformer.shard_groups()
    assert [[list(blocks).index(b) for b in g] for g in groups] == [[0, 1, 2], [3]]


def test_tied_embeddings_are_the_output_projections_rows() -> None:
    """The embedding tables are views of to_logits.weight (text rows first, then image
    rows: the logits' layout), and the embedding's gradient reaches that one weight.
    Caught when broken: image rows offset by the wrong amount (values differ)."""
    c = config(share_input_output_emb=True)
    model = DALLE(c)
    weight = model.to_logits.weight
    text_vocab = c.num_text_tokens + c.text_seq_len
    assert torch.equal(model.text_emb.weight, weight[:text_vocab])
    assert torch.equal(model.image_emb.weight, weight[text_vocab:])
    assert not any("emb" in n and "pos" not in n and "row" not in n and "col" not in n
                   for n, _ in model.named_parameters())
    tokens = torch.tensor([[3, 5]])
    model.image_emb(tokens).sum().backward()
    assert weight.grad is not None
    rows = weight.grad.abs().sum(dim=1).nonzero().flatten().tolist()
    assert rows == [text_vocab + 3, text_vocab + 5]


def test_state_dict_round_trip_keeps_the_ties() -> None:
    """A model loaded from another's state_dict (what resume, export and generate do)
    still shares: one optimizer step moves both names of a shared weight together."""
    c = config(**SHARED)
    torch.manual_seed(0)
    source = DALLE(c)
    state = source.state_dict()
    assert torch.equal(state["transformer.blocks.0.attn.to_qkv.weight"],
                       state["transformer.blocks.2.attn.to_qkv.weight"])
    assert not any(k.startswith(("text_emb.", "image_emb.")) for k in state)
    loaded = DALLE(c)
    loaded.load_state_dict(state)
    optimizer = make_adam(loaded.parameters(), 1e-2)
    loaded(*batch(c))["loss"].backward()
    optimizer.step()
    after = loaded.state_dict()
    assert torch.equal(after["transformer.blocks.0.attn.to_qkv.weight"],
                       after["transformer.blocks.2.attn.to_qkv.weight"])
    assert not torch.equal(after["transformer.blocks.0.attn.to_qkv.weight"],
                           state["transformer.blocks.0.attn.to_qkv.weight"])
    assert torch.equal(loaded.image_emb.weight, after["to_logits.weight"][58:])


# -- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "fragment"), [
    (["--shared_attn_ids", "0,0,1"], "--shared_attn_ids gives 3 ids for --depth 2"),
    (["--shared_ff_ids", "0"], "--shared_ff_ids gives 1 ids for --depth 2"),
])
def test_bad_shared_ids_are_one_line_errors(flags: list[str], fragment: str,
                                            tmp_path: Path) -> None:
    """Checked before any VAE is trained or loaded and before anything is written.
    Caught when broken: the check left to the model's validate (the built-in VAE is
    trained or read from the cache first, and the log says so)."""
    result = run_cli("train", *TINY_DALLE_FLAGS, *flags,
                     "--dalle_output_file_name", str(tmp_path / "dalle"), cwd=tmp_path)
    assert_user_error(result, fragment)
    assert "VAE" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_shared_attention_needs_one_pattern() -> None:
    with pytest.raises(ConfigError, match="layers 0 and 1 share attention id '0' but "
                       "--attn_types gives them full and axial_row"):
        DALLE(config(depth=2, shared_attn_ids=("0", "0"), attn_types=("full", "axial_row")))
    DALLE(config(depth=3, shared_attn_ids=("0", "1", "0"), attn_types=("full", "axial_row")))
