"""Every backend on 2 CPU ranks against one process: same data, same parameters, same
gradient norms.

2 ranks x batch b and 1 process x batch 2b see the same samples each step (one
DistributedSampler for all backends), so after 5 steps of fp32 training the parameters
must agree to float rounding (tests/backends/runs.py: rtol 1e-4, atol 1e-5).

The weights alone cannot see a gradient that is off by a constant factor (summed over
ranks instead of averaged, divided by the wrong count): clipping rescales it to
--clip_grad_norm and Adam divides it out. So every step's pre-clip gradient norm, logged
with --log_every_n_steps 1, must also equal the single process's.

Replicas (DDP, ZeRO 0-2, Horovod) must report one digest on all ranks; sharded engines
(FSDP, ZeRO-3) report each rank's own shard, which must differ, and their weights are
checked against the replicas' instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests import launch
from tests.backends.runs import (
    EMA_DECAY,
    EMA_START,
    RUNS,
    STEP_RATES,
    STEPS,
    Run,
    assert_ranks_consistent,
    assert_same_norms,
    assert_weights_close,
    batch_flag,
)
from tests.conftest import TINY_VAE_FLAGS, saved_checkpoint


def test_ema_is_the_hand_computed_average(trained: Callable[..., Run]) -> None:
    """One process keeping every step's checkpoint: the weights after each of the 5 steps,
    folded by hand (the weights themselves through --ema_start_step, then ema = D x ema +
    (1 - D) x weights), give the EMA its file holds. The 2-rank runs' EMAs equal this
    run's (test_two_ranks_equal_one_process), so every backend's is the hand-computed one.
    Caught: an update before the optimizer step (one step behind), a lerp weight of D
    instead of 1 - D, the start step off by one."""
    run = trained("single", "fp32", "--save_every_n_steps", "1", "--keep_n_checkpoints", "9")
    history = run.folder / "dalle-checkpoints"
    steps = [torch.load(history / f"step-{k:07d}.pt", weights_only=True)["weights"]
             for k in range(1, STEPS + 1)]
    ema = run.payload["ema_weights"]
    assert ema.keys() <= steps[-1].keys() and len(ema) > 10
    for name, got in ema.items():
        expected = steps[0][name].clone()  # step 1 <= --ema_start_step: copied
        for k in range(EMA_START, STEPS):
            expected = EMA_DECAY * expected + (1 - EMA_DECAY) * steps[k][name]
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-7), (  # lerp rounds
            name, (got - expected).abs().max().item())
        if got.ndim == 2:  # not the weights themselves: the average lags them
            assert not torch.allclose(got, steps[-1][name], atol=1e-5), name
    assert run.payload["configs"]["ema"] == {"ema_decay": EMA_DECAY,
                                             "ema_start_step": EMA_START, "ema_every": 1}


@pytest.mark.parametrize("name", list(RUNS))
def test_two_ranks_equal_one_process(name: str, trained: Callable[[str, str], Run]) -> None:
    single, run = trained("single", "fp32"), trained(name, "fp32")
    assert "precision fp32: the first step's matmuls ran in float32" in single.text
    assert single.payload["step"] == STEPS and sorted(single.grad_norms) == [1, 2, 3, 4, 5]
    assert_ranks_consistent(name, run.text)
    assert "global batch 16 = 8 per rank x 2 ranks" in run.text
    assert run.payload["step"] == STEPS and run.payload["world_size"] == 2
    assert run.payload["backend"] == name.split("-")[0]
    assert_same_norms(run.grad_norms, single.grad_norms)
    assert_weights_close(run.payload["weights"], single.payload["weights"])
    # the EMA each backend kept of its own (FSDP, ZeRO-3: sharded) values, gathered into
    # its file: the one process's (which test_ema_is_the_hand_computed_average checks)
    assert_weights_close(run.payload["ema_weights"], single.payload["ema_weights"])
    if name.startswith("deepspeed"):  # the tag's own EMA shards (ema/) read back whole
        from dalle_dist.checkpoint.load import read_any_checkpoint

        tag = read_any_checkpoint(run.folder / "dalle-ds-cp", "test")["ema_weights"]
        for key, tensor in run.payload["ema_weights"].items():
            assert torch.equal(tag[key], tensor), key
    # the schedule's rate reached the optimizer each backend steps (DeepSpeed's own wrapper
    # included): fails if a backend's scheduler steps another optimizer, or at epoch ends
    for logged in (single, run):
        assert [r["lr"] for r in logged.metrics] == pytest.approx(STEP_RATES, rel=1e-9)
    assert run.payload["configs"]["optimizer"]["optimizer"] == "adamw"
    assert len(list((run.folder / "dalle-samples").glob("step-*.png"))) == 2
    # The same initial weights, however placed: step 1's loss is computed before any update,
    # so it differs only by the order of the batch mean's sums. Other weights (FSDP shards
    # filled from another stream, a rank-dependent seed) move it by about 1e-3.
    assert run.losses[0] == pytest.approx(single.losses[0], rel=1e-6, abs=0)
    if name in ("fsdp", "deepspeed-zero3"):
        assert "built on the meta device: each rank initialised its own shards" in run.text


VAE_RUN = ["--epochs", "1", "--shapes_count", "64", "--sample_every_n_steps", "2"]


def train_vae(name: str, folder: Path) -> dict[str, torch.Tensor]:
    launcher, flags = RUNS[name]
    result = launcher("train-vae", *TINY_VAE_FLAGS, *flags, *batch_flag(name, 16), *VAE_RUN,
                      "--vae_output_file_name", str(folder / "vae"), cwd=folder)
    text = launch.output(result)
    assert result.returncode == 0, text[-4000:]
    assert_ranks_consistent(name, text)
    payload = saved_checkpoint(folder / "vae.pt")
    assert payload["kind"] == "vae" and payload["step"] == 64 // 16
    assert len(list((folder / "vae-samples").glob("step-*.png"))) == 2
    return payload["weights"]


@pytest.fixture(scope="module")
def ddp_vae(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The VAE trained by DDP: what the others must end equal to (each rank draws the
    same Gumbel noise for the same samples on every backend). Sample grids every 2 steps
    must not change that: building the sharded engines' inference copy drew from the
    training RNG until the fork covered it (FSDP ended 2.5e-3 away from DDP)."""
    return train_vae("torch", tmp_path_factory.mktemp("ddp_vae"))


@pytest.mark.parametrize("name", ["fsdp", "deepspeed-zero3", "horovod"])
def test_train_vae_on_two_ranks_equals_ddp(name: str, tmp_path: Path,
                                           ddp_vae: dict[str, torch.Tensor]) -> None:
    assert_weights_close(train_vae(name, tmp_path), ddp_vae)


MODEL_OPTIONS = ("--rotary_emb", "--shift_tokens")


def test_model_options_on_two_fsdp_ranks_equal_one_process(trained: Callable[..., Run]) -> None:
    """--rotary_emb and --shift_tokens on FSDP2 (sharded: the rotation tables and the shift
    are no parameters, and must be rebuilt the same on every rank) against one process,
    weights and every step's gradient norm; the options reached the model (no learned
    position embeddings in the checkpoint) and its config. Bug: a rank-local table (e.g.
    built on the meta device, or on one rank only) would leave the ranks' weights apart."""
    single = trained("single", "fp32", *MODEL_OPTIONS)
    run = trained("fsdp", "fp32", *MODEL_OPTIONS)
    for done in (single, run):
        config = done.payload["configs"]["model"]
        assert config["rotary_emb"] and config["shift_tokens"]
        assert not [k for k in done.payload["weights"] if "pos_emb" in k or "row_emb" in k]
    assert_ranks_consistent("fsdp", run.text)
    assert_same_norms(run.grad_norms, single.grad_norms)
    assert_weights_close(run.payload["weights"], single.payload["weights"])
    assert_weights_close(run.payload["ema_weights"], single.payload["ema_weights"])
    # the schedule's rate reached the optimizer each backend steps (DeepSpeed's own wrapper
    # included): fails if a backend's scheduler steps another optimizer, or at epoch ends
    for logged in (single, run):
        assert [r["lr"] for r in logged.metrics] == pytest.approx(STEP_RATES, rel=1e-9)
    assert run.payload["configs"]["optimizer"]["optimizer"] == "adamw"
