"""The validation loss (--val_fraction): the mean loss over every held-out sample, in eval
mode (no dropout, no null captions), the same number on 1 process and on 2 FSDP ranks
(one launch; FSDP also proves every rank takes as many forwards: an unequal count hangs
in its weight gathers); its records land in the metrics at their cadence; bad flags are
refused with one line and nothing written."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dalle_dist.data import CaptionCollate, DataConfig, make_loader
from dalle_dist.data.tokenizer import ByteTokenizer
from dalle_dist.errors import ConfigError
from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig
from dalle_dist.train.config import TrainConfig, ValidationConfig
from dalle_dist.train.dalle_task import DALLETask
from dalle_dist.train.validation import validation_loss
from tests import launch
from tests.conftest import TINY_DALLE_FLAGS, TINY_TRAIN_FLAGS, assert_user_error, run_cli

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
    reference = copy.deepcopy(task.model).eval()
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


def test_training_logs_validation_records_and_refuses_bad_flags(tmp_path: Path,
                                                                 tiny_vae: Path) -> None:
    """Through the CLI: --val_every_n_steps 3 on 2 steps per epoch x 2 epochs gives records
    at steps 2 (epoch end), 3, 4 (epoch end) with keys step, epoch, val_loss; the
    checkpoint records --null_cond_prob. Then bad input: one line, exit 2, no file. Bug
    seen failing: the epoch-end measurement missing (a record at 3 only)."""
    out = tmp_path / "run" / "dalle.pt"
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                     *TINY_TRAIN_FLAGS, "--epochs", "2", "--val_fraction", "0.25",
                     "--val_every_n_steps", "3", "--null_cond_prob", "0.2",
                     "--fidelity_images", "0", "--dalle_output_file_name", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in out.with_suffix(".metrics.jsonl").read_text()
               .splitlines()]
    val = [r for r in records if "val_loss" in r]
    assert [(r["step"], r["epoch"]) for r in val] == [(2, 0), (3, 1), (4, 1)], val
    assert all(set(r) == {"time", "step", "epoch", "val_loss"} for r in val)
    assert all(0 < r["val_loss"] < 20 for r in val)
    payload = torch.load(out, weights_only=True)
    assert payload["configs"]["model"]["null_cond_prob"] == 0.2

    for flags, message in [(["--val_fraction", "1"], "--val_fraction must be in [0, 1)"),
                           (["--val_fraction", "0.0001"], "holds out none"),
                           (["--null_cond_prob", "1.5"], "--null_cond_prob must be in")]:
        bad = tmp_path / "bad"
        result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                         *TINY_TRAIN_FLAGS, *flags, "--dalle_output_file_name",
                         str(bad / "dalle.pt"))
        assert_user_error(result, message)
        assert not bad.exists() or not any(bad.iterdir()), list(bad.iterdir())
    with pytest.raises(ConfigError, match="--val_every_n_steps needs --val_fraction"):
        ValidationConfig(val_every_n_steps=5).validate()


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
