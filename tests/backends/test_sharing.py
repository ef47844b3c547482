"""Shared layers, tied embeddings and activation checkpointing on every backend: one launch
per backend against the one-process run of the same model.

Three layers: attention and feed-forward shared between layers 0 and 2 (`--shared_attn_ids
0,1,0 --shared_ff_ids f,g,f`), so FSDP must shard blocks 0 and 2 as one unit apart from
block 1; embeddings tied to the output projection; every block checkpointed
(`--reversible`, DALLE-pytorch's spelling). The launches also accumulate 4 micro-batches
per step (--ga_steps 4), so tests/backends/test_accumulation.py reads the same runs
(tests/backends/conftest.py, shared_ga_run): a shared module or a tie must also hold
its gradient across the micro-batches of a step. Each launch checks:

- the weights and every step's gradient norm equal the one-process run's (a shared module
  whose gradient is reduced once per use, or a tie that trains two copies, would not);
- the checkpoint holds the shared modules under each layer's name with equal values, and
  no embedding tables (they are rows of `to_logits.weight`);
- the checkpoint loads into a model whose shared layers hold one module object;
- the log counts the parameters once and says that activation checkpointing is on.

ZeRO-1 and ZeRO-2 flatten every parameter into their own buffers (each `param.data` becomes
a view of one flat tensor), so a shared module or a tie that held on to a tensor taken
before `deepspeed.initialize` would read stale weights there. Bugs seen failing on both
stages: the tie reading a view of `to_logits.weight` taken at construction (grad norm
0.97 x the one-process run's at step 1); the optimizer given one entry per parameter name
(`named_parameters(remove_duplicate=False)`: DeepSpeed refuses the duplicate and the
launch fails).

ZeRO-3 partitions every parameter here (shared_ga_run's config), however small.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dalle_dist.checkpoint.export import export_checkpoint
from dalle_dist.checkpoint.tools import verify_payload
from dalle_dist.errors import CheckpointError
from dalle_dist.generate import load_sampler
from dalle_dist.model import DALLE, DALLEConfig
from tests import launch
from tests.backends.runs import (
    BATCH,
    COMMON,
    SHARED,
    STEPS,
    Run,
    assert_ranks_consistent,
    assert_same_norms,
    assert_weights_close,
)
from tests.conftest import run_cli


def logged_parameters(text: str) -> float:
    match = re.search(r"training DALL-E: ([0-9.]+)M parameters", text)
    assert match, "the run logs its parameter count"
    return float(match.group(1))


@pytest.mark.parametrize("name", ["torch", "fsdp", "deepspeed-zero1", "deepspeed-zero2",
                                  "deepspeed-zero3", "horovod"])
def test_shared_tied_checkpointed_two_ranks_equal_one_process(
        name: str, trained: Callable[..., Run], shared_ga_run: Callable[[str], Run]) -> None:
    single, run = trained("single", "fp32", *SHARED), shared_ga_run(name)
    assert_ranks_consistent(name, run.text)
    assert_same_norms(run.grad_norms, single.grad_norms)
    assert_weights_close(run.payload["weights"], single.payload["weights"])

    weights = run.payload["weights"]
    assert not any(k.startswith(("text_emb.", "image_emb.")) for k in weights)
    for part in ("attn", "ff"):
        first = {k: v for k, v in weights.items() if k.startswith(f"transformer.blocks.0.{part}.")}
        assert first
        for key, value in first.items():
            assert torch.equal(weights[key.replace("blocks.0.", "blocks.2.")], value), key
            assert not torch.equal(weights[key.replace("blocks.0.", "blocks.1.")], value), key

    model = DALLE(DALLEConfig.from_dict(run.payload["configs"]["model"]))
    model.load_state_dict(weights)
    blocks = model.transformer.blocks
    assert blocks[0].attn is blocks[2].attn and blocks[0].ff is blocks[2].ff
    assert blocks[1].attn is not blocks[0].attn
    unique = sum(p.numel() for p in model.parameters())
    assert logged_parameters(run.text) == pytest.approx(unique / 1e6, abs=0.006)
    assert "activation checkpointing: every transformer block" in run.text



def test_checkpoint_tools_export_and_resume_keep_the_ties(trained: Callable[..., Run],
                                                          tmp_path: Path) -> None:
    """The one-process run's file: `verify` counts a shared weight once and refuses a
    file whose names of one shared weight differ (load_state_dict would silently keep the
    last); an export samples from a model that shares; a resumed run keeps training one
    module (its names still equal after 5 more steps, the optimizer state restored)."""
    run = trained("single", "fp32", *SHARED)
    path = run.folder / "dalle.pt"
    model = DALLE(DALLEConfig.from_dict(run.payload["configs"]["model"]))
    assert verify_payload(run.payload, "PATH", path)["dalle"] == sum(
        p.numel() for p in model.parameters())
    tampered = {**run.payload, "weights": dict(run.payload["weights"])}
    key = "transformer.blocks.2.ff.proj_out.weight"
    tampered["weights"][key] = tampered["weights"][key] + 1
    with pytest.raises(CheckpointError, match="blocks.0.ff.proj_out.weight and "
                       f"{key} differ"):
        verify_payload(tampered, "PATH", path)

    export_checkpoint(path, tmp_path / "export")  # the EMA: runs.COMMON has --ema_decay
    sampler = load_sampler(tmp_path / "export.json", torch.device("cpu"))
    blocks = sampler.model.transformer.blocks
    assert blocks[0].attn is blocks[2].attn
    # the tied input embedding is a view of the output projection's EMA, not its own copy
    assert torch.equal(sampler.model.image_emb.weight,
                       run.payload["ema_weights"]["to_logits.weight"][-32:])

    result = run_cli("train", "--resume", str(path), *COMMON, *SHARED, "--epochs", "2",
                     "--batch_size", str(BATCH), "--dalle_output_file_name",
                     str(tmp_path / "resumed"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    assert "resuming " in text and "the optimizer starts fresh" not in text
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert resumed["step"] == 2 * STEPS
    weights = resumed["weights"]
    for key in weights:
        if key.startswith("transformer.blocks.0.attn."):
            assert torch.equal(weights[key], weights[key.replace("blocks.0", "blocks.2")])
            assert not torch.equal(weights[key], run.payload["weights"][key])
    verify_payload(resumed, "PATH", tmp_path / "resumed.pt")
