"""Sharded checkpoints (`NAME-sharded/`, torch.distributed.checkpoint) resume at another
world size and on another backend with the optimizer state intact, and a run interrupted
on 4 ranks and resumed on 2 with --ga_steps 2 sees the same global batches
(docs/checkpoints.md, "Sharded checkpoints").

One chain of real runs, each reading the one before (module fixtures):

- `four`: fsdp on 4 ranks x --ga_steps 1, global batch 16, 2 epochs of 4 steps, a save
  every 2 steps, all kept, and a sample grid at step 8: the uninterrupted run;
- `two`: four's save at step 2 (mid-epoch) continued by fsdp on 2 ranks x --ga_steps 2;
- then two's newest save goes round: one process, torch DDP, fsdp again, each run with no
  step left: its save before the first step is what it loaded.

"Equal" below is bit for bit: a resume moves tensors between ranks and never computes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from dalle_dist.checkpoint.dcp_io import read_whole
from dalle_dist.checkpoint.sharded_dir import is_complete
from dalle_dist.data.images import make_grid
from dalle_dist.generate import load_sampler
from dalle_dist.train.dalle_task import SAMPLE_IMAGES
from tests import launch
from tests.backends.runs import ROOT, grad_norms, metric_records
from tests.conftest import TINY_DALLE_FLAGS, run_cli

BATCH = 16
COMMON = [*TINY_DALLE_FLAGS, "--shapes_count", "64", "--batch_size", str(BATCH),
          "--fidelity_images", "0", "--learning_rate", "3e-3", "--log_every_n_steps", "1",
          "--save_every_n_steps", "2", "--keep_n_checkpoints", "9", "--epochs", "2",
          "--ema_decay", "0.8"]
#: fp32 reduction order only: derived in test_resumed_on_two_ranks_ends_where_four_end
LOSS_RTOL, WEIGHT_ATOL = 1e-6, 2e-6


def ok(result: Any) -> str:
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    return text


def saved(folder: Path, name: str) -> dict[str, Any]:
    """One save's model and optimizer state, whole, as DCP stored it."""
    return read_whole(folder / name)


def assert_same_state(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Weights, the EMA (--ema_decay: sharded like the weights), every Adam moment and
    step count, and the param groups: bit for bit."""
    assert got["model"].keys() == expected["model"].keys()
    for key, tensor in expected["model"].items():
        assert torch.equal(got["model"][key], tensor), key
    assert got["ema"].keys() == expected["ema"].keys() and expected["ema"]
    for key, tensor in expected["ema"].items():
        assert torch.equal(got["ema"][key], tensor), key
        # a save that wrote the weights where the EMA goes would pass the line above
        assert not torch.equal(tensor, expected["model"][key]) or tensor.ndim < 2, key
    assert got["optim"]["param_groups"] == expected["optim"]["param_groups"]
    assert got["optim"]["state"].keys() == expected["optim"]["state"].keys()
    for name, moments in expected["optim"]["state"].items():
        assert moments.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, tensor in moments.items():
            assert torch.equal(got["optim"]["state"][name][key], tensor), (name, key)


@pytest.fixture(scope="module")
def four(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Through tests/backends/memory_probe.py, which records the random state and batch
    its one sample grid (step 8) starts from."""
    folder = tmp_path_factory.mktemp("four")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MEMORY_PROBE_DIR": str(folder)}
    ok(launch._run(launch.command("torchrun", "train", "--distributed_backend", "fsdp",
                                  "--vae_path", str(tiny_vae), *COMMON,
                                  "--sample_every_n_steps", "8",
                                  "--dalle_output_file_name", "run", nproc=4,
                                  module="tests.backends.memory_probe"),
                   folder, env, launch.LAUNCH_TIMEOUT))
    return folder


@pytest.fixture(scope="module")
def two(four: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("two")
    text = ok(launch.torchrun("train", "--distributed_backend", "fsdp", "--ga_steps", "2",
                              "--resume", str(four / "run-sharded" / "step-0000002"), *COMMON,
                              "--dalle_output_file_name", "run", cwd=folder))
    return folder, text


def test_fsdp_writes_sharded_by_default_and_keeps_n(four: Path) -> None:
    """No --checkpoint_format: fsdp writes NAME-sharded/ (one .distcp per rank, no
    NAME.pt), `latest` names the newest save, and --keep_n_checkpoints 9 kept all five."""
    directory = four / "run-sharded"
    assert not (four / "run.pt").exists()
    assert (directory / "latest").read_text() == "step-0000008"
    saves = sorted(p.name for p in directory.iterdir() if p.is_dir())
    assert saves == [f"step-{s:07d}" for s in (0, 2, 4, 6, 8)]
    assert sorted(p.name for p in (directory / "step-0000008").glob("*.distcp")) == [
        f"__{rank}_0.distcp" for rank in range(4)]


def test_the_sample_grid_drawn_through_the_shards_is_the_whole_models(four: Path) -> None:
    """Under fsdp every rank samples its own captions through its shards (each block
    gathered for its call, the root's embeddings and logits around prefill and each
    decode step), so no rank holds the whole model. Rank 0's grid at step 8 is pixel for
    pixel the grid the saved step-8 weights draw in one process from the same random
    state and batch: 4 captions x 16 sampled tokens.
    Caught: sampling entry points not registered with FSDP2 (prefill reads the root's
    sharded embedding: the run stops), or a grid from weights other than the run's."""
    recorded = torch.load(four / "grid-input.pt", weights_only=True)
    sampler = load_sampler(four / "run-sharded" / "step-0000008", torch.device("cpu"))
    images, text = (recorded[k][:SAMPLE_IMAGES] for k in ("images", "text"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank ran: the same matmul sums
    try:
        with torch.random.fork_rng():
            torch.set_rng_state(recorded["rng"])
            generated = sampler.model.generate_images(text, sampler.vae, filter_thres=0.9)
    finally:
        torch.set_num_threads(threads)
    expected = make_grid(torch.cat([images, generated.float()]), nrow=len(images))
    with Image.open(four / "run-samples" / "step-0000008.png") as written:
        assert written.size == expected.size
        assert np.array_equal(np.asarray(written.convert("RGB")),
                              np.asarray(expected.convert("RGB")))


def test_four_ranks_resume_on_two_with_the_state_intact(four: Path,
                                                        two: tuple[Path, str]) -> None:
    """fsdp 4 -> 2 ranks: the save two made before its first step holds what it loaded,
    resharded by DCP, gathered: four's save, bit for bit, Adam moments included."""
    folder, text = two
    assert "resuming" in text and "at step 2 (epoch 0, 2 batches into the next)" in text
    assert "the epoch goes on from sample 32 (micro-batch 4 of each rank" in text
    assert "optimizer starts fresh" not in text
    assert_same_state(saved(folder / "run-sharded", "step-0000002"),
                      saved(four / "run-sharded", "step-0000002"))


def test_resumed_on_two_ranks_ends_where_four_end(four: Path, two: tuple[Path, str]) -> None:
    """4 ranks x ga 1 and 2 ranks x ga 2 take the same global batches in the same order
    (the sample order is a function of seed, epoch and global index), so from step 3 on
    `two` repeats `four` up to the order of fp32 sums.

    The bound. Step 3 starts from bit-identical weights and Adam state (the test above)
    on the same 16 samples, and each sample's forward is the same computation (4 samples
    per micro-batch on both sides), so only sums over samples differ in order: the loss
    mean, and each weight gradient's sum over samples (4 ranks x 4 against 2 ranks x 2
    micro-batches x 4). Reordering an fp32 sum of n terms moves it by at most about
    log2(n) x 2^-24 = 2.4e-7 (n = 16) of the sum of the terms' magnitudes: that bounds
    the loss and the gradient norm per step (their terms are positive). Adam's update of
    a weight is its gradient's moments over their root mean square, so the same relative
    change of a gradient changes the update by twice that at most, of an update <= lr:
    6 steps x 2 x 2.4e-7 x 3e-3 = 8.6e-9 per weight. Hence 1e-6 relative for losses and
    norms (the per-step bound, 4x, as later steps inherit earlier ones), and 2e-6 absolute
    for the weights. The weight bound assumes no gradient component cancels to near zero
    over the samples (the sum of magnitudes far above the sum); one that did could flip
    its update's sign (2 lr), which the tolerance would show. Measured: losses 8.9e-8
    relative, gradient norms 9.4e-8, weights 1.2e-7 apart.

    Caught: a resume that continues at the saved micro-batch count (2 of each rank's,
    the 4-rank split) replays samples 16-31 at step 3 and skips 48-63: step 3's loss is
    then far out of the bound."""
    folder, _ = two
    expected, got = (metric_records(f / "run.metrics.jsonl") for f in (four, folder))
    expected_loss = {r["step"]: r["loss"] for r in expected}
    got_loss = {r["step"]: r["loss"] for r in got}
    assert sorted(got_loss) == list(range(3, 9))
    for step, loss in got_loss.items():
        assert loss == pytest.approx(expected_loss[step], rel=LOSS_RTOL), (step, loss)
    norms, reference = grad_norms(folder / "run.metrics.jsonl"), grad_norms(
        four / "run.metrics.jsonl")
    for step, norm in norms.items():
        assert norm == pytest.approx(reference[step], rel=LOSS_RTOL), step
    end, reference_end = (saved(f / "run-sharded", "step-0000008")["model"]
                          for f in (folder, four))
    for key, tensor in reference_end.items():
        assert torch.allclose(end[key], tensor, rtol=0, atol=WEIGHT_ATOL), (
            key, (end[key] - tensor).abs().max().item())


def test_the_state_goes_round_single_ddp_and_fsdp(two: tuple[Path, str],
                                                  tmp_path: Path) -> None:
    """fsdp -> single (writing one file) -> torch DDP (reading that file, writing
    sharded) -> fsdp: each run has no step left, so its save before the first step holds
    what it loaded, and each equals two's newest save, Adam moments included: every
    backend reads what every other one writes, in both formats.
    Caught: a loader that skips the optimizer (a fresh Adam's moments), or names keyed by
    DDP's `module.` prefix."""
    folder, _ = two
    expected = saved(folder / "run-sharded", "step-0000008")

    ok(run_cli("train", "--resume", str(folder / "run-sharded"), *COMMON,
               "--checkpoint_format", "full", "--dalle_output_file_name", "one", cwd=tmp_path))
    single = torch.load(tmp_path / "one.pt", weights_only=True)
    assert single["step"] == 8 and single["backend"] == "single"
    assert_same_state({"model": single["weights"], "optim": single["optimizer"],
                       "ema": single["ema_weights"]}, expected)

    text = ok(launch.torchrun("train", "--distributed_backend", "torch", "--resume", "one.pt",
                              *COMMON, "--checkpoint_format", "sharded",
                              "--dalle_output_file_name", "ddp", cwd=tmp_path))
    assert "optimizer starts fresh" not in text
    assert_same_state(saved(tmp_path / "ddp-sharded", "step-0000008"), expected)

    text = ok(launch.torchrun("train", "--distributed_backend", "fsdp", "--resume",
                              "ddp-sharded", *COMMON, "--dalle_output_file_name", "back",
                              cwd=tmp_path))
    assert "optimizer starts fresh" not in text
    assert_same_state(saved(tmp_path / "back-sharded", "step-0000008"), expected)


def test_a_rank_killed_in_an_async_save_leaves_the_previous_one(tiny_vae: Path,
                                                                tmp_path: Path) -> None:
    """--async_checkpoint, a save every step: rank 1 dies by SIGKILL as its background
    thread starts writing the third save (step 2). `latest` still names the second
    (step 1), which is complete; --resume auto continues from it to the end, and the
    unfinished folder is gone once a later save is published.
    Caught: `latest` written when the save is handed to the background thread instead of
    when it completes (it names step 2, which has no DCP .metadata)."""
    args = ["train", "--distributed_backend", "fsdp", "--vae_path", str(tiny_vae),
            *TINY_DALLE_FLAGS, "--shapes_count", "64", "--batch_size", str(BATCH),
            "--fidelity_images", "0", "--log_every_n_steps", "1", "--epochs", "1",
            "--async_checkpoint", "--save_every_n_steps", "1",
            "--dalle_output_file_name", "run"]
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "CRASH_RANK": "1", "CRASH_AT_SAVE": "3"}
    crashed = launch._run(launch.command("torchrun", *args, module="tests.backends.crash_probe"),
                          tmp_path, env, launch.LAUNCH_TIMEOUT)
    text = launch.output(crashed)
    assert crashed.returncode != 0 and "crash probe: rank 1 killed while writing save 3" in text
    directory = tmp_path / "run-sharded"
    assert (directory / "latest").read_text() == "step-0000001"
    assert is_complete(directory / "step-0000001")
    assert not is_complete(directory / "step-0000002")

    text = ok(launch.torchrun(*args, "--resume", "auto", cwd=tmp_path))
    assert "resuming run-sharded at step 1 (epoch 0, 1 batches into the next)" in text
    assert sorted(launch.logged_steps(tmp_path / "run.metrics.jsonl"))[-3:] == [2, 3, 4]
    assert (directory / "latest").read_text() == "step-0000004"
    assert sorted(p.name for p in directory.iterdir() if p.is_dir()) == ["step-0000004"]
