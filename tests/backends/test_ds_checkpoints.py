"""DeepSpeed checkpoint directories at ZeRO 2 and 3 on 2 CPU ranks, with the real launcher.

(ZeRO-1 saves and loads through the very optimizer class of ZeRO-2, DeepSpeedZeroOptimizer,
with the same partition files; its directory is consolidated and compared with the run's
weights in tests/cli/test_checkpoint_cmd.py, and it trains like one process in
tests/backends/test_equivalence.py. Its stop-and-resume here repeated ZeRO-2's for 40 s.)

Each stage: a run stopped by SIGTERM (sent to the launcher's whole process group, as a
scheduler does) saves its directory and exits; resumed under deepspeed it ends where an
uninterrupted run ends (allclose: DeepSpeed's reductions are not bitwise reproducible
across a restart; one uninterrupted ZeRO-2 run serves both stages). The stopped
directory also samples with `generate` and resumes on the single backend directly (its
weights consolidated with DeepSpeed's zero_to_fp32).

Periodic saves write the tag alone: `dalle.pt` (a gather of every weight to rank 0 under
ZeRO-3) is written before the first step, on the stop and at the end, which each run is
watched for while it trains (assert_single_file_while_running).

The oracle for that single-backend resume is the stopped run's own weights, not an
uninterrupted run: the single backend starts a fresh optimizer and reseeds the RNG (one
rank instead of two), so it cannot retrace either DeepSpeed run; what it must do is start
from exactly the weights the stopped run held. Those are the single file the DeepSpeed run
wrote beside its tag at the stop (gathered from the live engine), compared with the
single run's first save (consolidated from the tag's partition files on disk).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from dalle_dist.checkpoint.deepspeed_dir import tag_step
from tests import launch
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli
from tests.train.test_resume import finish, spawn

# The stop comes after step 8, well inside the first epoch; 14 rather than 20 steps an
# epoch keeps every save the checks need (6, the stop, 12, the epoch's end) in 30% fewer
# steps on each of the four training runs of a stage.
STEPS_PER_EPOCH = 14
SAVE_EVERY = 6
FLAGS = [*TINY_DALLE_FLAGS, "--epochs", "2", "--batch_size", "16", "--shapes_count",
         str(STEPS_PER_EPOCH * 16), "--fidelity_images", "0",
         "--save_every_n_steps", str(SAVE_EVERY),
         "--log_every_n_steps", "1", "--resume", "auto", "--deepspeed",
         "--keep_n_checkpoints", "2"]
RTOL, ATOL = 1e-4, 1e-5


def saved_steps(total: int = 2 * STEPS_PER_EPOCH) -> list[int]:
    """The steps an uninterrupted run of FLAGS saves at: before step 1, every SAVE_EVERY
    steps, and at each epoch's end (the periodic save yields to it)."""
    return [0, *(s for s in range(1, total + 1)
                 if s % STEPS_PER_EPOCH == 0 or s % SAVE_EVERY == 0)]


def ds_cmd(*args: str) -> list[str]:
    return [str(launch.BIN / "deepspeed"), "--num_gpus", "2", "--master_port",
            str(launch.free_port()), "--module", "dalle_dist", *args]


def assert_single_file_while_running(proc: subprocess.Popen[str], run: Path, past: int,
                                     single_step: int, after_line: int = 0) -> None:
    """Once the run has logged step `past`, after periodic saves, `dalle.pt` is still the
    one of `single_step` (its start, or the stop it resumed from). `latest` is read first:
    every save writes `dalle.pt` before it moves `latest`, so a periodic save that wrote it
    (and gathered a ZeRO-3 model for it) would leave it at least as new as that tag.
    On a failure the launcher and its ranks end too, instead of training on after the test.
    """
    try:
        launch.wait_for_step(proc, run / "dalle.metrics.jsonl", past, after_line=after_line)
        newest = tag_step((run / "dalle-ds-cp" / "latest").read_text().strip())
        single = torch.load(run / "dalle.pt", weights_only=True)["step"]
        assert single == single_step < newest, \
            f"dalle.pt at step {single}, newest tag at {newest}"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def assert_close_weights(got: Path, expected: Path) -> None:
    a = torch.load(got, weights_only=True)
    b = torch.load(expected, weights_only=True)
    assert (a["step"], a["epoch"]) == (b["step"], b["epoch"]) == (2 * STEPS_PER_EPOCH, 2)
    for name, tensor in b["weights"].items():
        assert torch.allclose(a["weights"][name].float(), tensor.float(), rtol=RTOL,
                              atol=ATOL), (name, (a["weights"][name] - tensor).abs().max())


def run_args(tiny_vae: Path, stage: str) -> list[str]:
    return ["train", "--vae_path", str(tiny_vae), *FLAGS, "--zero_stage", stage,
            "--dalle_output_file_name", "dalle"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of an uninterrupted ZeRO-2 run of FLAGS: what every stage's resumed run
    must end at. ZeRO 2 and 3 train the same numbers (tests/backends/test_equivalence.py
    holds each to one process within 1e-5), far inside RTOL/ATOL here, where a resume that
    loses the optimizer state, the sampler position or a step misses by 1e-3 and more; one
    reference saves ZeRO-3 a launch."""
    folder = tmp_path_factory.mktemp("ds-reference")
    status, out = finish(spawn(ds_cmd(*run_args(tiny_vae, "2")), folder))
    assert status == 0, out[-3000:]
    return folder


@pytest.mark.parametrize("stage", ["2", "3"])
def test_zero_directory_stops_resumes_and_serves_single(stage: str, tiny_vae: Path,
                                                        uninterrupted: Path,
                                                        tmp_path: Path) -> None:
    args = run_args(tiny_vae, stage)
    run = tmp_path / "run"
    run.mkdir()
    proc = spawn(ds_cmd(*args), run)
    assert_single_file_while_running(proc, run, 8, 0)  # the save at step 6 wrote no dalle.pt
    os.killpg(proc.pid, signal.SIGTERM)
    _, out = finish(proc)
    assert out.count("stopped by SIGTERM after step") == 1, out[-3000:]  # printed by rank 0
    stopped_at = int(out.split("after step ")[1].split(":")[0])
    directory = run / "dalle-ds-cp"
    latest = (directory / "latest").read_text().strip()
    assert latest == f"global_step{stopped_at}"
    tags = sorted(p.name for p in directory.iterdir() if p.name.startswith("global_step"))
    # --keep_n_checkpoints 2: the stop's tag and the save before it, nothing older (fails
    # if pruning keeps too many or too few, or drops the newest instead of the oldest).
    previous = max(s for s in saved_steps() if s < stopped_at)
    assert tags == sorted([f"global_step{previous}", f"global_step{stopped_at}"]), tags
    stopped_weights = torch.load(run / "dalle.pt", weights_only=True)
    assert stopped_weights["step"] == stopped_at

    # The single-file view of the stopped run, consolidated from the ZeRO partitions.
    samples = run_cli("generate", "--dalle_path", str(directory), "--text", "a red circle",
                      "--num_images", "2", "--batch_size", "2", "--seed", "0",
                      "--outputs_dir", str(tmp_path / "outputs"))
    assert samples.returncode == 0, samples.stderr
    assert len(list((tmp_path / "outputs").rglob("*.png"))) == 3  # 2 images + the grid
    single = run_cli("train", "--resume", str(directory), "--epochs", "2", "--batch_size",
                     "16", "--shapes_count", str(STEPS_PER_EPOCH * 16), "--fidelity_images",
                     "0", "--keep_n_checkpoints", "5",
                     "--dalle_output_file_name", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    assert f"resuming {directory} at step {stopped_at}" in single.stdout
    assert "the optimizer starts fresh" in single.stdout
    # Its save before its first step holds the weights it started from: exactly the
    # stopped run's (fails if the consolidation reads another tag, misplaces ZeRO
    # partitions, or the single backend keeps its fresh initialisation).
    started = torch.load(tmp_path / "single-checkpoints" / f"step-{stopped_at:07d}.pt",
                         weights_only=True)
    assert started["weights"].keys() == stopped_weights["weights"].keys()
    for name, tensor in stopped_weights["weights"].items():
        assert torch.equal(started["weights"][name], tensor), name
    resumed = torch.load(tmp_path / "single.pt", weights_only=True)
    assert resumed["step"] == 2 * STEPS_PER_EPOCH and resumed["backend"] == "single"
    assert any(not torch.equal(resumed["weights"][k], v)
               for k, v in started["weights"].items()), "it trained on from there"

    # A save cut short after DeepSpeed wrote a newer tag, before `latest` moved: ignored.
    broken = directory / f"global_step{stopped_at + 1}"
    shutil.copytree(directory / latest, broken)
    for file in broken.glob("*.pt"):
        file.write_bytes(file.read_bytes()[:100])

    logged = len(launch.logged_steps(run / "dalle.metrics.jsonl"))
    proc = spawn(ds_cmd(*args), run)
    # Past the first epoch's end (step 14): neither it nor the periodic saves wrote dalle.pt.
    assert_single_file_while_running(proc, run, STEPS_PER_EPOCH + 1, stopped_at,
                                     after_line=logged)
    status, out = finish(proc)
    assert status == 0, out[-3000:]
    assert f"resuming dalle-ds-cp at step {stopped_at}" in out
    assert_close_weights(run / "dalle.pt", uninterrupted / "dalle.pt")  # written at the end


def test_a_pickled_payload_in_a_deepspeed_directory_never_runs(tmp_path: Path,
                                                              tiny_dalle: Path) -> None:
    """A directory laid out like ours whose DeepSpeed file carries a pickled callable."""
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    directory = tmp_path / "evil-ds-cp"
    tag = directory / "global_step4"
    tag.mkdir(parents=True)
    (directory / "latest").write_text("global_step4")
    meta = torch.load(tiny_dalle, weights_only=True)
    meta.pop("weights")
    torch.save({**meta, "zero_stage": 2}, tag / "auxiliary.pt")
    torch.save({"module": {}, "payload": Payload()}, tag / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": Payload()},
               tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")

    for command in (["generate", "--dalle_path", str(directory), "--text", "a red circle",
                     "--outputs_dir", str(tmp_path / "out")],
                    ["train", "--resume", str(directory), "--fidelity_images", "0",
                     "--dalle_output_file_name", str(tmp_path / "d")]):
        result = run_cli(*command)
        assert_user_error(result, "carries pickled Python objects", "posix.system")
        assert not marker.exists(), "the payload ran"
