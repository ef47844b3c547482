"""`dalle-dist plan --sbatch`: the recommended row as a Slurm script (plan/sbatch.py).
tests/slurm/test_slurm.py submits one to a real Slurm and requeues it."""

from __future__ import annotations

import shlex

import pytest

from dalle_dist.cli import main


def script(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["plan", *args]) == 0
    return capsys.readouterr().out


def srun_line(text: str) -> list[str]:
    [line] = [line for line in text.splitlines() if line.startswith("srun ")]
    return shlex.split(line.replace("$DATA", "DATA"))


def test_the_script_carries_the_row_and_the_train_flags(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """Two nodes of 4 GPUs; the model flags given to plan reach train as train spells
    them (a list flag, a switch by its alias, the EMA); plan's own flags do not.
    Caught: the single-GPU row chosen for 8 GPUs (a row of 1 GPU fits first)."""
    text = script(capsys, "--dim", "64", "--depth", "2", "--attn_types", "full,axial_row",
                  "--reversible", "--ema_decay", "0.999", "--batch_size", "32", "--sbatch",
                  "--nodes", "2", "--gpus_per_node", "4", "--time", "2:00:00",
                  "--gpu_memory", "24GB")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --time=2:00:00",
                 "#SBATCH --signal=USR1@120", "#SBATCH --requeue"):
        assert line in text.splitlines(), line
    cmd = srun_line(text)
    assert cmd[:2] == ["srun", "--kill-on-bad-exit=1"]
    train = cmd[cmd.index("train") + 1:]
    assert train[:2] == ["--distributed_backend", "torch"]
    assert "# the plan's row: torch DDP, bf16, global batch 32 = 4 per task x 8 tasks" in text
    for flag in (["--attn_types", "full,axial_row"], ["--activation_checkpointing"],
                 ["--ema_decay", "0.999"],
                 ["--batch_size", "32"], ["--precision", "bf16"], ["--resume", "auto"],
                 ["--dalle_output_file_name", "dalle"]):
        assert any(train[i:i + len(flag)] == flag for i in range(len(train))), flag
    for plan_only in ("--gpu_memory", "--nodes", "--sbatch", "--time", "--gpus"):
        assert plan_only not in train


def test_a_model_that_needs_sharding_gets_its_backend_and_cpu_no_gpus(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = script(capsys, "--dim", "2048", "--depth", "48", "--batch_size", "8", "--sbatch",
                  "--gpus_per_node", "8", "--gpu_memory", "16GB", "--precision", "bf16")
    train = srun_line(text)
    assert "--distributed_backend" not in train or train[train.index(
        "--distributed_backend") + 1] != "torch", "DDP does not fit 16 GB here"
    cpu = script(capsys, "--batch_size", "4", "--sbatch", "--gpus_per_node", "2", "--device",
                 "cpu", "--precision", "fp32")
    assert "--gpus-per-node" not in cpu and "#SBATCH --ntasks-per-node=2" in cpu


@pytest.mark.parametrize(("args", "message"), [
    (("--gpus", "4", "--nodes", "2", "--gpus_per_node", "4"),
     "--gpus 4 but --nodes 2 x --gpus_per_node 4 = 8"),
    (("--nodes", "0"), "--nodes must be >= 1, got 0"),
    (("--batch_size", "6", "--gpus_per_node", "4"), "must be a multiple of the 4 GPUs"),
    (("--dim", "8192", "--depth", "96", "--gpu_memory", "8GB"), "no backend takes batch"),
])
def test_plans_that_cannot_be_a_script_are_refused(capsys: pytest.CaptureFixture[str],
                                                   args: tuple[str, ...], message: str) -> None:
    assert main(["plan", "--sbatch", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
