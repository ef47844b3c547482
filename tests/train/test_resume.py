"""Exact resume, preemption and crash safety, with real processes and real signals.

A run killed at any moment (kill -9, SIGTERM, in the middle of a save) and continued with
`--resume auto` must end with exactly the parameters and optimizer state of a run that
was never interrupted: bit for bit on one process and on torch DDP over gloo (CPU).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests import launch
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli

# Short epochs keep the dozen runs here cheap; the random kills below still land in both
# epochs (seeds 1-3: steps 7, 30 and 10 of 40).
STEPS_PER_EPOCH = 20
BATCH = 8
FLAGS = [*TINY_DALLE_FLAGS, "--epochs", "2", "--batch_size", str(BATCH),
         "--shapes_count", str(STEPS_PER_EPOCH * BATCH), "--fidelity_images", "0",
         "--save_every_n_steps", "5", "--log_every_n_steps", "1", "--resume", "auto",
         # dropout: the restored RNG streams matter
         "--attn_dropout", "0.1", "--ff_dropout", "0.1"]
TOTAL = 2 * STEPS_PER_EPOCH


def spawn(cmd: list[str], cwd: Path) -> subprocess.Popen[str]:
    # The same thread count for every run: another one sums matmuls in another order.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dalle_dist", *args]


def torchrun_cmd(*args: str, launcher_args: tuple[str, ...] = ()) -> list[str]:
    return launch.command("torchrun", *args, launcher_args=launcher_args)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def stopped_step(out: str, signal_name: str) -> int:
    """N of the run's one "stopped by SIGNAL after step N: saved ..." line."""
    lines = [line for line in out.splitlines() if f"stopped by {signal_name} after step " in line]
    assert len(lines) == 1, out[-3000:]
    return int(lines[0].split("after step ")[1].split(":")[0])


def assert_same_training_state(got: Path, expected: Path) -> None:
    """Bit for bit: every weight, every optimizer tensor and the EMA (--ema_decay)."""
    a = torch.load(got, weights_only=True)
    b = torch.load(expected, weights_only=True)
    assert a.keys() == b.keys()
    for name, tensor in b.get("ema_weights", {}).items():
        assert torch.equal(a["ema_weights"][name], tensor), name
    assert b["epoch"] == 2, "the reference run is complete"
    assert (a["step"], a["epoch"], a["batch"]) == (b["step"], b["epoch"], b["batch"])
    for name, tensor in b["weights"].items():
        assert torch.equal(a["weights"][name], tensor), name
    for name, state in b["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(a["optimizer"]["state"][name][key], value), (name, key)


def uninterrupted_run(tiny_vae: Path, folder: Path, flags: list[str]) -> Path:
    status, out = finish(spawn(cli("train", "--vae_path", str(tiny_vae), *flags,
                                   "--dalle_output_file_name", "dalle"), folder))
    assert status == 0, out
    return folder / "dalle.pt"


@pytest.fixture(scope="module")
def uninterrupted(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uninterrupted_run(tiny_vae, tmp_path_factory.mktemp("uninterrupted"), FLAGS)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_a_random_step_then_resume_is_exact(seed: int, tiny_vae: Path,
                                                       tmp_path: Path,
                                                       uninterrupted: Path) -> None:
    kill_at = random.Random(seed).randrange(3, TOTAL - 8)
    cmd = cli("train", "--vae_path", str(tiny_vae), *FLAGS, "--dalle_output_file_name", "dalle")
    proc = spawn(cmd, tmp_path)
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", kill_at)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = launch.logged_step(tmp_path / "dalle.metrics.jsonl")
    assert killed_at < TOTAL
    saved = torch.load(tmp_path / "dalle.pt", weights_only=True)["step"]
    assert saved <= killed_at

    status, out = finish(spawn(cmd, tmp_path))
    assert status == 0, out
    assert f"resuming dalle.pt at step {saved}" in out
    assert_same_training_state(tmp_path / "dalle.pt", uninterrupted)


def test_sigterm_saves_exits_0_and_resumes_exactly(tiny_vae: Path, tmp_path: Path,
                                                   uninterrupted: Path) -> None:
    cmd = cli("train", "--vae_path", str(tiny_vae), *FLAGS, "--dalle_output_file_name", "dalle")
    proc = spawn(cmd, tmp_path)
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", 12)
    proc.send_signal(signal.SIGTERM)
    status, out = finish(proc)
    assert status == 0, out
    assert "stopped by SIGTERM after step" in out
    stopped_at = int(out.split("stopped by SIGTERM after step ")[1].split(":")[0])
    assert 12 <= stopped_at < TOTAL
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == stopped_at

    status, out = finish(spawn(cmd, tmp_path))
    assert status == 0, out
    assert_same_training_state(tmp_path / "dalle.pt", uninterrupted)


#: A warmup, then a cosine decay, under AdamW: the schedule a resume must continue, not
#: restart (--warmup_steps counted in optimizer steps, whatever --ga_steps is).
SCHEDULE = ["--optimizer", "adamw", "--weight_decay", "0.1", "--lr_schedule", "cosine",
            "--warmup_steps", "6", "--min_lr", "1e-4",
            # and an EMA that copies up to step 3 and averages every second step after it:
            # a resume that lost it, restarted it from the resumed weights or counted its
            # steps from the resume would not be bit for bit
            "--ema_decay", "0.9", "--ema_start_step", "3", "--ema_every", "2"]
GA_FLAGS = [*FLAGS, "--ga_steps", "2", *SCHEDULE]


def rates(metrics: Path) -> dict[int, float]:
    """The rate logged at each step; a step logged twice (the steps a resumed run
    repeats after its checkpoint) keeps its newest value."""
    return {r["step"]: r["lr"] for r in map(json.loads, metrics.read_text().splitlines())
            if "lr" in r}


def expected_rates(total: int) -> dict[int, float]:
    """SCHEDULE at --learning_rate 1e-3 over `total` optimizer steps: 1e-3 x k / 6 for
    k <= 6, then cosine from 1e-3 at step 7 to 1e-4 at the last step."""
    def rate(k: int) -> float:
        if k <= 6:
            return 1e-3 * k / 6
        return 1e-4 + 9e-4 * (1 + math.cos(math.pi * (k - 7) / (total - 7))) / 2
    return {k: rate(k) for k in range(1, total + 1)}


def assert_same_rates(resumed: Path, uninterrupted: Path, total: int = TOTAL) -> None:
    """Every step's rate, resumed against uninterrupted (equal, not close) and against
    the documented schedule. Fails if a resume restarts the warmup or the decay, or
    counts micro-batches instead of optimizer steps."""
    got, reference = rates(resumed.with_suffix(".metrics.jsonl")), rates(
        uninterrupted.with_suffix(".metrics.jsonl"))
    assert got == reference
    assert reference == pytest.approx(expected_rates(total), rel=1e-9)


@pytest.fixture(scope="module")
def uninterrupted_ga(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uninterrupted_run(tiny_vae, tmp_path_factory.mktemp("uninterrupted_ga"), GA_FLAGS)


def test_sigterm_with_ga_steps_resumes_exactly(tiny_vae: Path, tmp_path: Path,
                                               uninterrupted_ga: Path) -> None:
    """--ga_steps 2: a signal that arrives inside an accumulation window stops after the
    window's optimizer step (saves fall only between steps), and the resumed run continues
    at the next window: bit for bit the uninterrupted run. Fails if a save records the
    micro-batches of a window it did not finish, or a resumed epoch starts at a step
    index instead of a micro-batch index (it would skip or repeat samples)."""
    cmd = cli("train", "--vae_path", str(tiny_vae), *GA_FLAGS, "--dalle_output_file_name",
              "dalle")
    proc = spawn(cmd, tmp_path)
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", 12)
    proc.send_signal(signal.SIGTERM)
    status, out = finish(proc)
    assert status == 0, out
    stopped_at = stopped_step(out, "SIGTERM")
    saved = torch.load(tmp_path / "dalle.pt", weights_only=True)
    assert saved["step"] == stopped_at and saved["batch"] == 2 * (stopped_at % STEPS_PER_EPOCH)

    status, out = finish(spawn(cmd, tmp_path))
    assert status == 0, out
    assert "EMA weights: decay 0.9, from step 4, every 2 step(s)" in out
    assert "holds no EMA weights" not in out
    assert_same_training_state(tmp_path / "dalle.pt", uninterrupted_ga)
    assert "ema_weights" in torch.load(uninterrupted_ga, weights_only=True)
    assert_same_rates(tmp_path / "dalle.pt", uninterrupted_ga)


def test_sigint_is_a_polite_stop_too(tiny_vae: Path, tmp_path: Path) -> None:
    """Ctrl-C saves where it stops: fails if the stop line names a step the checkpoint does
    not hold (no save on the stop, or a save before the step that was reported)."""
    cmd = cli("train", "--vae_path", str(tiny_vae), *FLAGS, "--dalle_output_file_name", "dalle")
    proc = spawn(cmd, tmp_path)
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", 3)
    proc.send_signal(signal.SIGINT)
    status, out = finish(proc)
    assert status == 0 and "stopped by SIGINT" in out, out
    assert "Traceback" not in out
    stopped_at = stopped_step(out, "SIGINT")
    assert 3 <= stopped_at < TOTAL
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == stopped_at


def unfinished_saves(directory: Path, name: str) -> list[Path]:
    """The temporary files of `name`'s saves that hold bytes. A save renamed into place
    between the listing and the stat is finished, not unfinished: a plain
    `p.stat()` in the comprehension raised FileNotFoundError when that happened."""
    found = []
    for path in directory.glob(f".{name}.*.tmp"):
        try:
            if path.stat().st_size > 0:
                found.append(path)
        except FileNotFoundError:
            continue
    return found


def test_kill_9_in_the_middle_of_a_save_keeps_the_previous_checkpoint(
        tiny_vae: Path, tmp_path: Path) -> None:
    """A checkpoint big enough that a save takes a while; the kill lands while the
    temporary file is being written: the previous checkpoint stays whole and resumes."""
    # 6 steps: the kill lands at step 2 or 3, and the resumed run saves what is left
    # (each save writes ~150 MB: 16 steps spent most of the test's time saving).
    big = ["--dim", "512", "--depth", "4", "--heads", "4", "--dim_head", "64",
           "--text_seq_len", "40", "--epochs", "1", "--batch_size", "4", "--shapes_count", "24",
           "--fidelity_images", "0", "--save_every_n_steps", "1", "--log_every_n_steps", "1",
           "--resume", "auto"]
    cmd = cli("train", "--vae_path", str(tiny_vae), *big, "--dalle_output_file_name", "dalle")
    proc = spawn(cmd, tmp_path)
    deadline = time.monotonic() + 180
    while True:
        if (launch.logged_step(tmp_path / "dalle.metrics.jsonl") >= 2
                and unfinished_saves(tmp_path, "dalle.pt")):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        assert proc.poll() is None and time.monotonic() < deadline, "no save was caught"
        time.sleep(0.001)
    proc.wait()
    assert list(tmp_path.glob(".dalle.pt.*.tmp")), "killed while the new file was written"
    before = torch.load(tmp_path / "dalle.pt", weights_only=True)
    assert before["step"] >= 1

    status, out = finish(spawn(cmd, tmp_path))
    assert status == 0, out
    assert f"resuming dalle.pt at step {before['step']}" in out
    assert "removing an unfinished save" in out
    assert not list(tmp_path.glob(".dalle.pt.*.tmp"))
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == 24 // 4


def test_keep_n_checkpoints_keeps_the_newest(tiny_vae: Path, tmp_path: Path) -> None:
    result = run_cli("train", "--vae_path", str(tiny_vae), *FLAGS, "--keep_n_checkpoints", "3",
                     "--dalle_output_file_name", str(tmp_path / "dalle"))
    assert result.returncode == 0, result.stderr
    kept = sorted(p.name for p in (tmp_path / "dalle-checkpoints").iterdir())
    assert kept == [f"step-{s:07d}.pt" for s in (TOTAL - 10, TOTAL - 5, TOTAL)]
    newest = torch.load(tmp_path / "dalle-checkpoints" / kept[-1], weights_only=True)
    assert newest["step"] == TOTAL
    older = torch.load(tmp_path / "dalle-checkpoints" / kept[0], weights_only=True)
    assert older["step"] == TOTAL - 10 and older["epoch"] == 1
    assert older["batch"] == STEPS_PER_EPOCH - 10


def test_flags_that_contradict_the_checkpoint_are_named(tiny_dalle: Path) -> None:
    result = run_cli("train", "--dalle_path", str(tiny_dalle), "--dim", "64", "--depth", "2",
                     "--heads", "3", "--epochs", "2", "--fidelity_images", "0")
    assert_user_error(result, "dim 64 (checkpoint: 32)", "heads 3 (checkpoint: 2)")
    assert "depth" not in result.stderr  # agrees with the checkpoint


def test_another_optimizer_or_schedule_is_refused_on_resume(tiny_dalle: Path) -> None:
    """The optimizer state is per parameter group and the rate per step: a resumed run
    that changed either would not continue the one it resumes. Named flag by flag, the
    unchanged ones (--betas) not at all; before any step."""
    result = run_cli("train", "--dalle_path", str(tiny_dalle), *TINY_DALLE_FLAGS, "--epochs",
                     "2", "--fidelity_images", "0", "--optimizer", "adamw", "--lr_schedule",
                     "cosine")
    assert_user_error(result, "optimizer and learning-rate schedule flags contradict the "
                      f"checkpoint {tiny_dalle}", "optimizer adamw (checkpoint: adam)",
                      "weight_decay 0.01 (checkpoint: 0.0)",
                      "lr_schedule cosine (checkpoint: constant)", "a resumed run keeps them")
    assert "betas" not in result.stderr


def test_resume_auto_without_a_checkpoint_starts_fresh(tiny_vae: Path, tmp_path: Path) -> None:
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--epochs", "1",
                     "--batch_size", "16", "--shapes_count", "32", "--fidelity_images", "0",
                     "--resume", "auto", "--dalle_output_file_name", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert "no checkpoint of" in result.stdout and "starting fresh" in result.stdout


# -- under launchers --------------------------------------------------------------------

def worker_pids(launcher: subprocess.Popen[str]) -> list[int]:
    """The training processes under a launcher (python -m dalle_dist children)."""
    children = psutil.Process(launcher.pid).children(recursive=True)
    return [c.pid for c in children if "dalle_dist" in " ".join(c.cmdline())
            and c.pid != launcher.pid and "torchrun" not in " ".join(c.cmdline()[:2])]


#: global batch 16: 10 optimizer steps an epoch
DDP_FLAGS = [*FLAGS, "--distributed_backend", "torch", "--batch_size", str(2 * BATCH),
             *SCHEDULE]


@pytest.fixture(scope="module")
def uninterrupted_ddp(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp")
    result = launch.torchrun("train", "--vae_path", str(tiny_vae), *DDP_FLAGS,
                             "--dalle_output_file_name", "dalle", cwd=folder)
    assert result.returncode == 0, launch.output(result)[-3000:]
    return folder / "dalle.pt"


def test_sigterm_under_torchrun_saves_and_resumes_exactly(tiny_vae: Path, tmp_path: Path,
                                                          uninterrupted_ddp: Path) -> None:
    args = ("train", "--vae_path", str(tiny_vae), *DDP_FLAGS, "--dalle_output_file_name",
            "dalle")
    proc = spawn(torchrun_cmd(*args), tmp_path)
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", 10)
    proc.send_signal(signal.SIGTERM)  # to torchrun, which passes it on to its workers
    _, out = finish(proc)
    assert "stopped by SIGTERM after step" in out, out[-3000:]
    stopped_at = int(out.split("after step ")[1].split(":")[0])
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == stopped_at

    status, out = finish(spawn(torchrun_cmd(*args), tmp_path))
    assert status == 0, out[-3000:]
    assert_same_training_state(tmp_path / "dalle.pt", uninterrupted_ddp)
    assert_same_rates(tmp_path / "dalle.pt", uninterrupted_ddp, total=TOTAL // 2)


def test_sigterm_to_the_workers_ends_torchrun_with_status_0(tiny_vae: Path,
                                                           tmp_path: Path) -> None:
    """What a cluster scheduler does: every training process gets SIGTERM."""
    args = ("train", "--vae_path", str(tiny_vae), *DDP_FLAGS, "--dalle_output_file_name",
            "dalle")
    proc = spawn(torchrun_cmd(*args), tmp_path)
    # Past step 5, so the stop's step is unlikely to be a --save_every_n_steps one, whose
    # periodic save would hold the right step even if the stop saved nothing.
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", 6)
    workers = worker_pids(proc)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    status, out = finish(proc)
    assert status == 0, out[-3000:]
    # Fails if the ranks stop without saving, or at different steps than the one reported.
    stopped_at = stopped_step(out, "SIGTERM")
    assert 6 <= stopped_at < TOTAL
    assert torch.load(tmp_path / "dalle.pt", weights_only=True)["step"] == stopped_at


def test_torchrun_restarts_after_a_rank_is_killed_and_matches(tiny_vae: Path, tmp_path: Path,
                                                             uninterrupted_ddp: Path) -> None:
    args = ("train", "--vae_path", str(tiny_vae), *DDP_FLAGS, "--dalle_output_file_name",
            "dalle")
    proc = spawn(torchrun_cmd(*args, launcher_args=("--max-restarts", "2")), tmp_path)
    launch.wait_for_step(proc, tmp_path / "dalle.metrics.jsonl", 17)
    workers = worker_pids(proc)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    status, out = finish(proc)
    assert status == 0, out[-3000:]
    assert "resuming dalle.pt at step" in out, "the restarted group resumed"
    assert_same_training_state(tmp_path / "dalle.pt", uninterrupted_ddp)
