"""Slurm as users have it, on a real one-node cluster (scripts/slurm_local.sh: Debian's
slurm-wlm, slurmctld and slurmd on this machine): srun as the launcher, torchrun inside
a job, a batch script from `plan --sbatch` run to its end, and one that gets SIGUSR1
mid-run, saves, requeues itself and resumes to the same weights.

`make test` installs slurm-wlm where it is missing (root on Debian); without it these
tests fail, saying how to install it: none is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from dalle_dist.backends.slurm import expand_nodelist
from tests import launch
from tests.backends.runs import BATCH, COMMON, RUNS, Run, batch_flag
from tests.backends.test_slurm_env import REAL_NODELISTS
from tests.conftest import TINY_DALLE_FLAGS, saved_checkpoint

ROOT = Path(__file__).resolve().parents[2]
MISSING = "Slurm is not installed: apt-get install slurm-wlm (make test does it as root on Debian)"
#: a job's training: 160 steps of the tiny model at global batch 16 (8 s on 2 CPUs)
JOB_STEPS = 160


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment that reaches the one-node cluster (SLURM_CONF), started for this
    module and stopped after it."""
    assert shutil.which("slurmctld") and shutil.which("srun"), MISSING
    folder = tmp_path_factory.mktemp("slurm")
    script = ROOT / "scripts" / "slurm_local.sh"
    started = subprocess.run([str(script), "start", str(folder)], capture_output=True,
                             text=True, timeout=120, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    for name in [n for n in env if n.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
        if name != "SLURM_CONF":  # (a suite run inside a Slurm job: this cluster's own)
            del env[name]
    try:
        yield env
    finally:
        subprocess.run([str(script), "stop", str(folder)], capture_output=True, timeout=60,
                       check=False)


def slurm(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    result = subprocess.run(list(args), env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, " ".join(args) + ": " + result.stdout + result.stderr
    return result.stdout


def test_the_node_list_parser_agrees_with_scontrol(cluster: dict[str, str]) -> None:
    """Every real-world list of tests/backends/test_slurm_env.py, expanded by Slurm."""
    for nodelist, hosts in REAL_NODELISTS:
        assert slurm(cluster, "scontrol", "show", "hostnames", nodelist).split() == hosts
        assert expand_nodelist(nodelist) == hosts


def run_in_job(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
               ) -> subprocess.CompletedProcess[str]:
    """`cmd` (an srun line), its output in the failure when it fails or times out."""
    try:
        result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        out = (error.stdout or b"").decode() + (error.stderr or b"").decode()
        nodes = subprocess.run(["scontrol", "show", "node"], env=env, capture_output=True,
                               text=True, timeout=30, check=False).stdout
        raise AssertionError(f"{cmd[:4]} ran past {timeout} s: {out[-3000:]}\nthe node: "
                             f"{nodes}") from None
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def same_weights(payload: dict, reference: dict) -> None:
    for key in ("weights", "ema_weights"):
        for name, value in reference[key].items():
            assert torch.equal(payload[key][name], value), f"{key} {name}"


@pytest.mark.parametrize("name", ["torch", "fsdp", "deepspeed-zero2"])
def test_srun_trains_as_the_launcher_does(cluster: dict[str, str], trained: Callable[..., Run],
                                          tiny_vae: Path, tmp_path: Path, name: str) -> None:
    """`srun -n 2 python -m dalle_dist train` (no torchrun, no deepspeed launcher) trains
    the weights and EMA of the `trained` run of the same flags, bit for bit. Caught: the
    step's variables not adopted (each task a world of one: the runs' digests differ)."""
    reference = trained(name, "fp32")
    flags = RUNS[name][1]
    run_in_job(["srun", "-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "dalle_dist",
                "train", "--vae_path", str(tiny_vae), *COMMON, "--precision", "fp32",
                "--sample_every_n_steps", "2", "--dalle_output_file_name",
                str(tmp_path / "dalle"), *flags, *batch_flag(name, BATCH)], tmp_path, cluster)
    same_weights(saved_checkpoint(tmp_path / "dalle.pt"), reference.payload)


def test_torchrun_inside_a_job_keeps_its_own_ranks(cluster: dict[str, str],
                                                   trained: Callable[..., Run],
                                                   tiny_vae: Path, tmp_path: Path) -> None:
    """torchrun started by `srun -n 1` inside a job: both ranks see SLURM_PROCID=0, and
    torchrun's RANK must win (two rank 0s would never form the group)."""
    cmd = launch.command("torchrun", "train", "--vae_path", str(tiny_vae), *COMMON,
                         "--precision", "fp32", "--sample_every_n_steps", "2",
                         "--dalle_output_file_name", str(tmp_path / "dalle"),
                         "--distributed_backend", "torch", "--batch_size", str(BATCH))
    run_in_job(["srun", "-n", "1", "-c", "2", *cmd], tmp_path, cluster)
    same_weights(saved_checkpoint(tmp_path / "dalle.pt"), trained("torch", "fp32").payload)


def job_state(env: dict[str, str], job: str) -> tuple[str, int]:
    """(JobState, Restarts) of a job scontrol still knows."""
    fields = dict(item.split("=", 1) for item in
                  slurm(env, "scontrol", "show", "job", "-o", job).split() if "=" in item)
    return fields["JobState"], int(fields.get("Restarts", "0"))


#: the states a job does not leave (unless something requeues it)
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def wait_for(env: dict[str, str], job: str, done: Callable[[str, int], bool],
             timeout: float = 240) -> tuple[str, int]:
    """The job's (state, restarts) once `done` says so; fails when the job has ended
    otherwise (a final state held for 5 s: a requeue passes through one)."""
    deadline = time.monotonic() + timeout
    ended: tuple[tuple[str, int], float] | None = None
    while time.monotonic() < deadline:
        state = job_state(env, job)
        if done(*state):
            return state
        if state[0] not in FINAL:
            ended = None
        elif ended is None or ended[0] != state:
            ended = (state, time.monotonic())
        elif time.monotonic() - ended[1] > 5:
            raise AssertionError(f"job {job} ended {state[0]} after {state[1]} restarts")
        time.sleep(0.5)
    raise AssertionError(f"job {job} still {job_state(env, job)} after {timeout} s")


def steps_logged(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line)


def test_a_plan_sbatch_job_runs_and_a_usr1_requeues_it_to_the_same_weights(
        cluster: dict[str, str], tiny_vae: Path, tmp_path: Path) -> None:
    """The script `plan --sbatch` prints, submitted as it is (the data and the run's
    length through its DATA variable), twice: one job runs to its end; the other gets
    SIGUSR1 mid-run (as `--signal=USR1@120` sends it before a time limit), saves,
    requeues itself, restarts with `--resume auto` and ends with the same weights and
    EMA. Caught in a scratch copy: no requeue after the save (the job ends COMPLETED at
    the stop, never restarted); the requeue's SIGTERM killing the root before it wrote the
    requeue and stop lines (seen in CI; a 2 s pause after scontrol lost them each time)."""
    plan = subprocess.run(
        [sys.executable, "-m", "dalle_dist", "plan", *TINY_DALLE_FLAGS, "--batch_size", "16",
         "--sbatch", "--gpus_per_node", "2", "--device", "cpu", "--precision", "fp32",
         "--signal_margin", "60", "--job_name", "tiny"],
        capture_output=True, text=True, timeout=120, check=False)
    assert plan.returncode == 0, plan.stderr
    assert "#SBATCH --signal=USR1@60" in plan.stdout and "#SBATCH --requeue" in plan.stdout
    data = ["--vae_path", str(tiny_vae), "--epochs", "1", "--shapes_count",
            str(JOB_STEPS * 16), "--fidelity_images", "0", "--log_every_n_steps", "1",
            "--ema_decay", "0.9"]
    folders = {name: tmp_path / name for name in ("whole", "requeued")}
    jobs = {}
    for name, folder in folders.items():
        folder.mkdir()
        (folder / "job.sh").write_text(plan.stdout)
        env = {**cluster, "DATA": " ".join(data)}
        jobs[name] = slurm(env, "sbatch", "--parsable", "--chdir", str(folder),
                           str(folder / "job.sh")).strip().split(";")[0]

    # the second job (it starts when the first is done: one node of 2 CPUs)
    job, folder = jobs["requeued"], folders["requeued"]
    deadline = time.monotonic() + 240
    while steps_logged(folder / "dalle.metrics.jsonl") < 10:
        assert time.monotonic() < deadline, "the second job logged no 10 steps"
        time.sleep(0.2)
    slurm(cluster, "scancel", "--signal=USR1", job)
    # (the job starts again once its old credential expires: 10 s on the test cluster)
    wait_for(cluster, job, lambda state, restarts: state == "COMPLETED" and restarts >= 1)
    assert wait_for(cluster, jobs["whole"], lambda s, r: s == "COMPLETED") == ("COMPLETED", 0)

    log = (folder / f"tiny-{job}.out").read_text()
    assert f"Slurm job {job} requeued: it restarts and continues from the save" in log
    stopped = int(log.split("stopped by SIGUSR1 after step ")[1].split(":")[0])
    assert 10 <= stopped < JOB_STEPS
    assert f"resuming dalle.pt at step {stopped}" in log
    whole = saved_checkpoint(folders["whole"] / "dalle.pt")
    assert whole["step"] == JOB_STEPS
    same_weights(saved_checkpoint(folder / "dalle.pt"), whole)


def test_check_reports_the_job_it_runs_in(cluster: dict[str, str], tmp_path: Path) -> None:
    """`srun -n 1 dalle-dist check`: the job id, node, tasks and requeue (on: the test
    cluster's JobRequeue=1); the text line too. Outside a job: "not in a Slurm job"."""
    out = run_in_job(["srun", "-n", "1", sys.executable, "-m", "dalle_dist", "check", "--json"],
                     tmp_path, cluster).stdout
    job = json.loads(out)["slurm"]
    assert job["job_id"].isdigit() and job["nodes"] == [os.uname().nodename.split(".")[0]]
    assert (job["tasks"], job["requeue"], job["step"]) == ("1", True, True)
    text = run_in_job(["srun", "-n", "1", sys.executable, "-m", "dalle_dist", "check"],
                      tmp_path, cluster).stdout
    assert f"slurm         Slurm job {int(job['job_id']) + 1}: 1 node(s)" in text
    outside = subprocess.run([sys.executable, "-m", "dalle_dist", "check"], env={
        k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
        capture_output=True, text=True, timeout=120, check=False).stdout
    assert "slurm         not in a Slurm job" in outside
