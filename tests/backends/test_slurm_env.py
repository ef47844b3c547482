"""srun as a launcher (backends/slurm.py): Slurm's compressed node lists and tasks per node,
and torchrun's variables from a step's. tests/slurm/test_slurm.py runs the same on a real
one-node Slurm, and checks the parser against `scontrol show hostnames`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dalle_dist.backends import slurm
from dalle_dist.errors import ConfigError
from dalle_dist.train.preemption import stop_on_signals, stop_requested, stop_signal_name

#: Node lists users met, with where (each broke a parser there), and their hosts.
REAL_NODELISTS = [
    # Megatron-Bridge PR #3807: a bracket inside a mixed list gave "nodeA,nodeB001"
    ("nodeA,nodeB[001,003],nodeC", ["nodeA", "nodeB001", "nodeB003", "nodeC"]),
    # Lightning #14896: splitting on commas gave the host "linux[1"
    ("linux[1,2]", ["linux1", "linux2"]),
    # Lightning #5160: named nodes without ranges
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
    # scoop #26 and PR #30: lists and ranges mixed in one bracket
    ("nodes[006,011]", ["nodes006", "nodes011"]),
    ("host[001,003-004,006]", ["host001", "host003", "host004", "host006"]),
    # mpich #2786: a dash before the bracket
    ("host-[001-002]", ["host-001", "host-002"]),
    # skypilot PR #8891, with scontrol's own expansion quoted there
    ("ml-16-node-[001-002,004],ml-17-node-[001-003]",
     ["ml-16-node-001", "ml-16-node-002", "ml-16-node-004", "ml-17-node-001",
      "ml-17-node-002", "ml-17-node-003"]),
    # the example, and two brackets in one name (multiplied out in order)
    ("gpu[001-004,007],cpu12", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu007", "cpu12"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
]


@pytest.mark.parametrize(("nodelist", "hosts"), REAL_NODELISTS)
def test_compressed_node_lists_expand_as_slurm_does(nodelist: str, hosts: list[str]) -> None:
    assert slurm.expand_nodelist(nodelist) == hosts


def test_tasks_per_node_and_bad_lists() -> None:
    assert slurm.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.tasks_per_node("4") == [4]
    for bad in ("node[a-b]", ""):
        with pytest.raises(ValueError):
            slurm.expand_nodelist(bad)
    with pytest.raises(ValueError):
        slurm.tasks_per_node("2(y3)")


def step(**extra: str) -> dict[str, str]:
    """Task 5 of an 8-task step on two nodes (the second node's second task), job 4242."""
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "gpu[007-008]",
            "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
            **extra}


def test_a_step_s_variables_become_torchrun_s() -> None:
    assert slurm.step_launch_env(step()) == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(slurm.PORT_BASE + 4242 % slurm.PORT_SPAN), "LOCAL_WORLD_SIZE": "4"}
    # MASTER_PORT and MASTER_ADDR given by the user are kept
    env = slurm.step_launch_env(step(MASTER_PORT="29400", MASTER_ADDR="10.0.0.1"))
    assert env is not None and (env["MASTER_PORT"], env["MASTER_ADDR"]) == ("29400", "10.0.0.1")
    # srun -n 2 inside an 8-task allocation: the step's count, not the job's
    env = slurm.step_launch_env(step(SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="8"))
    assert env is not None and env["WORLD_SIZE"] == "2"


def test_torchrun_inside_slurm_wins_and_a_batch_shell_is_no_step() -> None:
    assert slurm.step_launch_env(step(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")) is None
    batch_shell = {k: v for k, v in step().items() if k != "SLURM_STEP_ID"}
    assert slurm.step_launch_env(batch_shell) is None
    assert slurm.step_launch_env({}) is None
    environ = step()
    assert slurm.adopt_step_env(environ) and environ["RANK"] == "5"
    with pytest.raises(ConfigError, match="srun: not a Slurm host range"):
        slurm.step_launch_env(step(SLURM_STEP_NODELIST="gpu[a-b]"))


def test_horovod_under_plain_srun_is_refused_with_the_command_that_works() -> None:
    with pytest.raises(ConfigError, match="each task would train alone") as caught:
        slurm.check_horovod_launch(step())
    assert "horovodrun -np $SLURM_NTASKS" in (caught.value.fix or "")
    slurm.check_horovod_launch(step(HOROVOD_RANK="5"))  # horovodrun started it
    slurm.check_horovod_launch({})


def test_usr1_stops_training_only_inside_a_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a job, SIGUSR1 is recorded like SIGTERM (a save at the next step), and one
    after the loop (the time limit's warning to a run that is ending) is ignored: at its
    default action it killed the process, this one included. Outside a job,
    stop_on_signals leaves it alone (its default action: the process ends)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with stop_on_signals():
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    try:
        with stop_on_signals():
            os.kill(os.getpid(), signal.SIGUSR1)
            assert stop_requested() and stop_signal_name() == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGUSR2)
        with stop_on_signals():  # a second run in the process starts unstopped
            assert not stop_requested()
        assert not stop_requested()
    finally:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)


#: scontrol as the requeue's own kill leaves it: `requeue` ends it by SIGTERM, after
#: counting the restart (took) or not (refused); `show job` reports the count
KILLED_SCONTROL = """#!/bin/sh
restarts=$(cat "$RESTARTS")
case "$1" in
  show) echo "JobId=7 JobState=RUNNING Restarts=$restarts" ;;
  requeue) [ "$TAKES" = 1 ] && echo $((restarts + 1)) > "$RESTARTS"; kill -TERM $$ ;;
esac
"""


@pytest.mark.parametrize("takes", [True, False])
def test_a_requeue_whose_kill_ends_scontrol_first_still_counts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, takes: bool) -> None:
    """The requeue ends the job's processes, scontrol (a child of the root) among them.
    Killed after the requeue took, it exits silently with -15: the job's restart count
    says the requeue took, and `requeue` says so (it said "submit the job again", and a
    second job would train on the same files). Killed otherwise: a failure, in words
    (its empty output raised an IndexError)."""
    (tmp_path / "scontrol").write_text(KILLED_SCONTROL)
    (tmp_path / "scontrol").chmod(0o755)
    (tmp_path / "restarts").write_text("2\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RESTARTS", str(tmp_path / "restarts"))
    monkeypatch.setenv("TAKES", str(int(takes)))
    failed = slurm.requeue("7")
    assert failed == ("" if takes else "scontrol ended with status -15")


def test_the_single_backend_under_srun_of_several_tasks_is_refused() -> None:
    """`srun -n 8 python -m dalle_dist train` without a backend flag would start 8 runs
    on the same files; one task, or torchrun's ranks inside a job, are fine."""
    with pytest.raises(ConfigError, match="srun started 8 tasks, and the single backend"):
        slurm.check_single_launch(step())
    slurm.check_single_launch(step(SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1"))
    slurm.check_single_launch(step(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"))
    slurm.check_single_launch({})
