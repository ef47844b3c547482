"""A hung peer and a dead peer on every distributed backend, with the real launchers.

One run per backend goes through all of it: training, SIGSTOP of one rank (a hung peer),
then `--resume auto` and SIGKILL of one rank (a dead peer, no --max-restarts), then
`--resume auto` to the end. Each failure must end the surviving rank and the launcher with
a non-zero status within --collective_timeout + 60 s, the survivor naming the wait in
docs/design.md's one line; the newest checkpoint must pass `checkpoint verify` and carry the
run on. Without the bound (watch.py) the stopped peer hangs the launcher for good and the
launch below times out; without the PeerLost conversion the dead peer ends in a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dalle_dist.checkpoint.resume import newest_checkpoint
from dalle_dist.checkpoint.tools import verify_checkpoint
from dalle_dist.train.config import RunPaths
from dalle_dist.train.run_log import RunLog
from tests import launch
from tests.backends.runs import assert_ranks_consistent
from tests.conftest import TINY_DALLE_FLAGS

#: Short, since that the wait ends is tested, not its length; long enough that a step or
#: a save on a loaded machine never reads as a lost peer.
TIMEOUT_S = 10
BOUND_S = TIMEOUT_S + 60
# The stop comes after step 12, the kill about 7 steps after the resume (near step 20): 30
# leaves the last run 10 to 15 steps to carry on from its newest save.
STEPS = 30
# (launcher, backend flags, rank to stop, rank to kill): rank 0 and rank 1 take turns, so
# the root (store host, Horovod's coordinator, the one that writes) is lost on each kind.
CASES = {
    "torch": ("torchrun", ["--distributed_backend", "torch"], 1, 0),
    "fsdp": ("torchrun", ["--distributed_backend", "fsdp"], 0, 1),
    "deepspeed": ("deepspeed", ["--deepspeed", "--zero_stage", "2"], 1, 0),
    "horovod": ("horovodrun", ["--distributed_backend", "horovod"], 0, 1),
}
LOST = re.compile(r"error: rank (\d) waited (\d+) s in (.+) for the other ranks; a rank died, "
                  r"hung or took another path \(see its log; then dalle-dist doctor LOG\)")


def flags(backend: str, out: Path, vae: Path) -> list[str]:
    per_worker = backend == "horovod"  # Horovod's --batch_size is per worker
    return ["train", "--vae_path", str(vae), *TINY_DALLE_FLAGS, "--epochs", "1",
            "--batch_size", "4" if per_worker else "8", "--shapes_count", str(STEPS * 8),
            "--fidelity_images", "0", "--save_every_n_steps", "5", "--log_every_n_steps", "1",
            "--sample_every_n_steps", "0", "--collective_timeout", str(TIMEOUT_S),
            "--resume", "auto", "--dalle_output_file_name", str(out), *CASES[backend][1]]


def lose_a_rank(backend: str, out: Path, vae: Path, sig: signal.Signals, victim: int,
                after: int) -> tuple[subprocess.CompletedProcess[str], float]:
    """Start (or resume) the run, send `sig` to rank `victim` once it has done `after`
    more steps, and return the launcher's result and how long it took to end."""
    metrics = RunPaths.for_output(str(out)).metrics
    lines = len(launch.logged_steps(metrics))
    start_step = launch.logged_step(metrics)
    proc = launch.start(launch.command(CASES[backend][0], *flags(backend, out, vae)),
                        cwd=out.parent, stderr=subprocess.STDOUT)
    try:
        launch.wait_for_step(proc, metrics, start_step + after, after_line=lines)
        ranks = launch.rank_processes(proc)
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[victim].pid, sig)
        lost_at = time.monotonic()
        result = launch.finish(proc, timeout=BOUND_S + 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return result, time.monotonic() - lost_at


def assert_named_wait(result: subprocess.CompletedProcess[str], elapsed: float,
                      survivor: int, hung: bool) -> None:
    text = result.stdout
    assert result.returncode != 0, text[-3000:]
    assert elapsed <= BOUND_S, f"{elapsed:.0f} s to end the run"
    lines = [m for m in LOST.finditer(text) if int(m.group(1)) == survivor]
    assert lines, text[-3000:]
    waited = int(lines[0].group(2))
    # A stopped peer is waited for the whole timeout; a dead one is seen at once.
    assert (TIMEOUT_S <= waited <= TIMEOUT_S + 5) if hung else waited < TIMEOUT_S, waited
    # The launchers print tracebacks of their own; a rank's would pass through our code.
    frames = [line for line in text.splitlines() if "File " in line and "dalle_dist" in line]
    assert not frames, text[-3000:]


def verify_newest(out: Path) -> int:
    """`checkpoint verify`'s check, in this process (the command's own tests run it as a
    process), on what `--resume auto` would take; returns its step."""
    newest = newest_checkpoint(RunPaths.for_output(str(out)), RunLog(None, enabled=False))
    assert newest is not None
    summary = verify_checkpoint(newest)  # raises CheckpointError on a bad one
    assert summary.startswith("ok: "), summary
    return int(re.search(r"step (\d+)", summary).group(1))


def hang_kill_resume(backend: str, folder: Path, vae: Path) -> str:
    """The whole story on one backend; returns what it measured, for the log."""
    out = folder / "d"
    folder.mkdir()
    _, _, stop_rank, kill_rank = CASES[backend]

    result, stopped_s = lose_a_rank(backend, out, vae, signal.SIGSTOP, stop_rank, after=12)
    assert_named_wait(result, stopped_s, survivor=1 - stop_rank, hung=True)
    first = verify_newest(out)
    assert first >= 10

    result, killed_s = lose_a_rank(backend, out, vae, signal.SIGKILL, kill_rank, after=7)
    assert_named_wait(result, killed_s, survivor=1 - kill_rank, hung=False)
    assert verify_newest(out) > first

    finished = launch.finish(launch.start(
        launch.command(CASES[backend][0], *flags(backend, out, vae)), cwd=folder,
        stderr=subprocess.STDOUT), timeout=launch.LAUNCH_TIMEOUT)
    assert finished.returncode == 0, finished.stdout[-3000:]
    assert_ranks_consistent(backend, finished.stdout)
    assert launch.logged_step(RunPaths.for_output(str(out)).metrics) == STEPS
    assert verify_newest(out) == STEPS
    assert not list(folder.glob(".d.pt.*.tmp")), "an unfinished save was left behind"
    return (f"{backend}: stopped rank {stop_rank} -> launcher ended after {stopped_s:.1f} s; "
            f"killed rank {kill_rank} -> {killed_s:.1f} s")


def test_hung_and_dead_peers_end_the_run_and_it_resumes(tmp_path: Path, tiny_vae: Path
                                                        ) -> None:
    """The four backends at once: their runs mostly wait (for the timeout, for a launcher
    to give up on a stopped rank), so together they take about as long as the slowest."""
    with ThreadPoolExecutor(len(CASES)) as pool:
        runs = {backend: pool.submit(hang_kill_resume, backend, tmp_path / backend, tiny_vae)
                for backend in CASES}
    failed = []
    for backend, run in runs.items():
        try:
            print(run.result())
        except AssertionError as exc:
            failed.append(f"{backend}: {exc}")
    assert not failed, "\n\n".join(failed)
