"""The validation loss (--val_fraction): the mean loss over every held-out sample, in eval
mode (no dropout, no null captions), the same number on 1 process and on 2 FSDP ranks
(one launch; FSDP also proves every rank takes as many forwards: an unequal count hangs
in its weight gathers); for `train` and `train-vae` alike, its records land in the
metrics and the loss plot at their cadence, a run with validation trains the weights of
one without on the training part alone, the grids show held-out images, and bad flags are
refused with one line and nothing written; the VAE's loss (its Gumbel noise seeded per
pass) is a fixed number for fixed weights."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from dalle_dist.data import CaptionCollate, DataConfig, make_loader
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.errors import ConfigError
from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.train.config import TrainConfig, VAESchedule, ValidationConfig
from dalle_dist.train.dalle_task import DALLETask
from dalle_dist.train.vae_task import VAETask
from dalle_dist.train.validation import held_out_sums, validation_loss
from tests import launch
from tests.conftest import TINY_DALLE_FLAGS, TINY_VAE_FLAGS, assert_user_error, run_cli
from tests.train.test_loss_plot import COLOURS as PLOT_COLOURS
from tests.train.test_loss_plot import pixels_of

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "tests.train.test_validation"]
#: 32 shapes hold out 13 at 0.3 (keys "0".."31"): 7 and 6 per rank, batches of 3.
SHAPES, FRACTION, BATCH = 32, 0.3, 3


def measure(backend: Any) -> dict[str, Any]:
    """This rank's validation loss, and the reference: every held-out sample alone through
    an undistributed copy of the same model in eval mode, averaged."""
    from dalle_dist.train.commands import distribute

    torch.manual_seed(0)
    vae = DiscreteVAE(VAEConfig(image_size=16, num_layers=2, num_tokens=32, codebook_dim=16,
                                hidden_dim=16, num_resnet_blocks=0)).eval()
    tokenizer = ByteTokenizer()
    # dropout and null captions on: validation must use neither
    config = DALLEConfig(num_text_tokens=tokenizer.vocab_size, text_seq_len=40,
                         num_image_tokens=32, image_fmap_size=4, dim=32, depth=2, heads=2,
                         dim_head=16, ff_dropout=0.5, null_cond_prob=0.5)
    task = DALLETask(config, vae, tokenizer, TrainConfig(), {}, False, backend.device)
    reference = copy.deepcopy(task.materialise()).eval()
    engine = distribute(task, backend, TrainConfig())
    collate = CaptionCollate(tokenizer, 40, False)
    loader, _ = make_loader(DataConfig(shapes_count=SHAPES, image_size=16), 16, BATCH,
                            backend.rank, backend.world_size, 0, collate, True,
                            val_fraction=FRACTION)
    held = loader.held_out
    val = validation_loss(task, engine, backend, held)
    with torch.no_grad():
        losses = [reference(*task.inputs(collate([held.dataset[i]]), backend.device,
                                         training=False))["loss"].item()
                  for i in range(held.samples)]
    return {"rank": backend.rank, "val_loss": val, "hand": sum(losses) / len(losses),
            "held_out": held.samples, "batches": len(held),
            "train_mode_kept": engine.module.training}


def test_validation_loss_is_the_same_on_two_fsdp_ranks(tmp_path: Path) -> None:
    """One process: the loss equals the per-sample reference (13 samples in batches of 3:
    the last batch holds 1, weighed by its size). 2 FSDP ranks in one launch (7 and 6
    held-out samples: 3 batches each after padding): both report that number.
    Bugs seen failing: the batch means averaged unweighted; validation left in train mode
    (dropout on); captions nulled by --null_cond_prob during validation; each rank
    reporting its own share's mean (no all-reduce). A rank skipping its padding forward
    would leave FSDP waiting in its gather until the 120 s timeout (not broken on purpose
    here: too slow for the suite)."""
    from dalle_dist.backends import SingleBackend

    single = measure(SingleBackend.on(torch.device("cpu")))
    assert single["held_out"] == 13
    assert abs(single["val_loss"] - single["hand"]) < 1e-5, single
    assert single["train_mode_kept"], "the model goes back to train mode"
    cmd = [str(launch.BIN / "torchrun"), "--nproc_per_node", "2", "--master_port",
           str(launch.free_port()), *SCRIPT, str(tmp_path)]
    result = launch.finish(launch.start(cmd, cwd=REPO), timeout=240)
    assert result.returncode == 0, launch.output(result)[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for seen in ranks:
        assert abs(seen["val_loss"] - single["val_loss"]) < 1e-5, (seen, single)
        assert abs(seen["hand"] - single["hand"]) < 1e-6
        assert seen["batches"] == 3
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"]


#: 22 images hold out 5 at --val_fraction 0.3 ("img01", "img06", "img07", "img14", "img17"):
#: 17 to train on, 2 steps per epoch at batch 8
FOLDER_IMAGES = 22
#: a solid colour per image, far apart, so a grid's tile names the image it shows
COLOURS = [(r, g, b) for r in (0, 127, 255) for g in (0, 127, 255) for b in (0, 127, 255)
           ][:FOLDER_IMAGES]


def colour_folder(root: Path, keep: set[str] | None = None) -> Path:
    """Image i: a solid COLOURS[i] square with a caption; keep: only those keys."""
    root.mkdir(parents=True)
    for i, colour in enumerate(COLOURS):
        if keep is None or f"img{i:02d}" in keep:
            Image.new("RGB", (20, 20), colour).save(root / f"img{i:02d}.png")
            (root / f"img{i:02d}.txt").write_text(f"a square of colour {i}\n")
    return root


def grid_top_row(path: Path, count: int) -> list[int]:
    """The image (index into COLOURS) each of the first `count` tiles of a sample grid's
    top row shows: 16 px pictures are drawn 64 px wide with 2 px gaps (make_grid)."""
    grid = np.asarray(Image.open(path).convert("RGB")).astype(int)
    centres = [grid[34, 2 + i * 66 + 32] for i in range(count)]
    return [int(np.argmin([np.abs(c - np.array(k)).sum() for k in COLOURS])) for c in centres]


def command_flags(command: str, request: pytest.FixtureRequest, out: Path) -> list[str]:
    """A tiny model of `command` on 2 epochs of batch 8, a loss line every step."""
    common = ["--epochs", "2", "--batch_size", "8", "--log_every_n_steps", "1"]
    if command == "train-vae":
        return ["train-vae", *TINY_VAE_FLAGS, *common, "--vae_output_file_name", str(out)]
    return ["train", "--vae_path", str(request.getfixturevalue("tiny_vae")),
            *TINY_DALLE_FLAGS, *common, "--null_cond_prob", "0.2", "--fidelity_images", "0",
            "--dalle_output_file_name", str(out)]


@pytest.mark.parametrize("command", ["train-vae", "train"])
def test_training_logs_validation_records_and_refuses_bad_flags(
        tmp_path: Path, command: str, request: pytest.FixtureRequest) -> None:
    """Through the CLI, for the VAE and DALL-E alike, on a folder:
    - --val_every_n_steps 3 on 2 steps per epoch x 2 epochs gives records at steps 2
      (epoch end), 3, 4 (epoch end) with keys step, epoch, val_loss, drawn as the loss
      plot's red curve;
    - the run trains exactly the weights of a run without validation on the folder less
      its held-out images: validation changes no random number training draws, and the
      held-out images are never trained on (were they, the epochs would differ);
    - the sample grid's top row shows held-out images only.
    Then bad input: one line, exit 2, no file (--val_fraction 0.0001 on built-in shapes:
    the built-in data is split too; train's --null_cond_prob is checked here as well).
    Bugs seen failing: the epoch-end measurement missing (a record at 3 only); train-vae
    not passing --val_fraction to its loader (no records: all images trained on);
    validation_loss without its fork_rng (its seeded pass reset the RNG training draws
    from: other weights); the grid drawn from the last training batch; train-vae not
    validating ValidationConfig (--val_every_n_steps alone trained without a word)."""
    from dalle_dist.data.split import split_indices

    keys = [f"img{i:02d}" for i in range(FOLDER_IMAGES)]
    trained_idx, held_idx = split_indices(keys, 0.3)
    assert len(held_idx) == 5 and len(trained_idx) == 17
    folder_flag = "--image_folder" if command == "train-vae" else "--image_text_folder"
    out = tmp_path / "run" / "model.pt"
    result = run_cli(*command_flags(command, request, out), folder_flag,
                     str(colour_folder(tmp_path / "all")), "--val_fraction", "0.3",
                     "--val_every_n_steps", "3", "--sample_every_n_steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in out.with_suffix(".metrics.jsonl").read_text()
               .splitlines()]
    val = [r for r in records if "val_loss" in r]
    assert [(r["step"], r["epoch"]) for r in val] == [(2, 0), (3, 1), (4, 1)], val
    assert all(set(r) == {"time", "step", "epoch", "val_loss"} for r in val)
    assert all(0 < r["val_loss"] < 20 for r in val)
    plot = out.with_name("model-loss.png")
    assert pixels_of(plot, PLOT_COLOURS["val_loss"]) > 100, "the validation curve is drawn"
    assert grid_top_row(out.with_name("model-samples") / "step-0000002.png", 5) == held_idx

    plain = tmp_path / "plain" / "model.pt"
    result = run_cli(*command_flags(command, request, plain), folder_flag,
                     str(colour_folder(tmp_path / "train-part",
                                       {keys[i] for i in trained_idx})),
                     "--sample_every_n_steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any("val_loss" in line for line in
                   plain.with_suffix(".metrics.jsonl").read_text().splitlines())
    payload = torch.load(out, weights_only=True)
    plain_weights = torch.load(plain, weights_only=True)["weights"]
    assert payload["step"] == 4
    assert payload["weights"].keys() == plain_weights.keys()
    assert all(torch.equal(payload["weights"][k], plain_weights[k]) for k in plain_weights)
    if command == "train":
        assert payload["configs"]["model"]["null_cond_prob"] == 0.2

    # on 8 built-in shapes: a check that is missing ends in a short run, not a timeout
    builtin = ["--shapes_count", "8"]
    bad_input = [(["--val_fraction", "1.5"], "--val_fraction must be in [0, 1)"),
                 (["--val_fraction", "0.0001"], "holds out none"),
                 (["--val_every_n_steps", "5"], "--val_every_n_steps needs --val_fraction")
                 if command == "train-vae" else
                 (["--null_cond_prob", "1.5"], "--null_cond_prob must be in")]
    for flags, message in bad_input:
        bad = tmp_path / "bad"
        result = run_cli(*command_flags(command, request, bad / "model.pt"), *builtin,
                         *flags)
        assert_user_error(result, message)
        assert not bad.exists() or not any(bad.iterdir()), list(bad.iterdir())
    with pytest.raises(ConfigError, match="--val_every_n_steps needs --val_fraction"):
        ValidationConfig(val_every_n_steps=5).validate()


def test_vae_validation_loss_is_fixed_for_fixed_weights_and_leaves_the_rng() -> None:
    """The VAE draws Gumbel noise in every forward, eval mode too: each validation pass
    seeds its forked RNG, so the same weights give the same loss however far training's
    RNG has moved between two measurements, and the RNG is left as it was found. The loss
    is the VAE's own training loss (reconstruction + KL) over every held-out image,
    in eval mode, train mode restored after.
    Bugs seen failing: no seed_pass (the second measurement drew other noise); no
    fork_rng (the RNG state after validation differed)."""
    from dalle_dist.backends import SingleBackend
    from dalle_dist.train.commands import distribute
    from dalle_dist.train.validation import seed_pass

    backend = SingleBackend.on(torch.device("cpu"))
    torch.manual_seed(0)
    task = VAETask(VAEConfig(image_size=16, num_layers=2, num_tokens=32, codebook_dim=16,
                             hidden_dim=16, num_resnet_blocks=0, kl_loss_weight=0.5),
                   VAESchedule(), TrainConfig(), {})
    engine = distribute(task, backend, TrainConfig())
    loader, _ = make_loader(DataConfig(shapes_count=SHAPES, image_size=16), 16, BATCH, 0, 1,
                            0, CaptionCollate(None, 0, False), False, val_fraction=FRACTION)
    held = loader.held_out
    first = validation_loss(task, engine, backend, held)
    torch.rand(1000)  # what training draws between two measurements
    state = torch.get_rng_state()
    second = validation_loss(task, engine, backend, held)
    assert torch.equal(torch.get_rng_state(), state), "validation leaves the RNG as it was"
    assert first == second
    assert engine.module.training

    reference = copy.deepcopy(task.materialise()).eval()
    with torch.no_grad():
        seed_pass(backend.device)
        weighted = [(reference(*task.inputs(batch, backend.device, training=False)), n)
                    for batch, n in held.batches()]
    assert sum(n for _, n in weighted) == held.samples == 13
    hand = sum(out["loss"].item() * n for out, n in weighted) / held.samples
    assert abs(first - hand) < 1e-6, (first, hand)
    assert all(out["kl"] > 0 and out["loss"] > out["recon_loss"] for out, _ in weighted)


class _Losses:
    """A task and engine whose forward hands back the next of a list of mean losses."""

    def __init__(self, losses: list[torch.Tensor]) -> None:
        self.losses = iter(losses)

    def inputs(self, batch: Any, device: torch.device, training: bool = True) -> tuple:
        return ()

    def forward(self) -> dict[str, torch.Tensor]:
        return {"loss": next(self.losses)}


def test_held_out_sums_count_samples_on_the_host() -> None:
    """[sum of mean loss x n, total n], with no tensor made from host data per batch (on
    CUDA each was a pageable host-to-device copy: seen, one torch.tensor(n) per batch).
    The padding batches weigh 0."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class FromHost(TorchDispatchMode):
        made = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            self.made += func is torch.ops.aten.lift_fresh.default
            return func(*args, **(kwargs or {}))

    losses = [torch.tensor(v) for v in (2.0, 3.0, 5.0, 7.0)]
    fake = _Losses(losses)
    with FromHost() as seen:
        sums = held_out_sums(fake, fake, torch.device("cpu"),  # type: ignore[arg-type]
                             [(None, 3), (None, 3), (None, 1), (None, 0)])
    assert sums.tolist() == [2 * 3 + 3 * 3 + 5 * 1, 7]
    assert seen.made == 0


def rank_main(out: Path) -> None:
    from dalle_dist.backends.config import DistributedConfig
    from dalle_dist.backends.registry import backend_from_config

    backend = backend_from_config(DistributedConfig(backend="fsdp", collective_timeout=120))
    backend.initialize()
    seen = measure(backend)
    (out / f"rank-{backend.rank}.json").write_text(json.dumps(seen))
    backend.shutdown()


if __name__ == "__main__":
    from dalle_dist.cli.exits import exit_now

    rank_main(Path(sys.argv[1]))
    exit_now(0)  # as `train` ends a rank (see tests/backends/test_fp16_agreement.py)
