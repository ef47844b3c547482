"""Backend mistakes end as docs/design.md's one-line error with exit 2, on every rank, no hang.

Rank processes are started bare (torchrun's environment, no launcher in between) so each
one's exit status and stderr can be checked; one case goes through torchrun itself to show
the launcher returns instead of hanging. Every launch has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import launch
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli

TRAIN = ["train", *TINY_DALLE_FLAGS, "--epochs", "1", "--shapes_count", "64",
         "--fidelity_images", "0"]


def assert_every_rank(results: list[subprocess.CompletedProcess[str]], *fragments: str) -> str:
    """The same one-line error from every rank (so no rank waits forever for another)."""
    lines = {assert_user_error(result, *fragments) for result in results}
    assert len(lines) == 1, lines
    return lines.pop()


def snapshot(root: Path) -> set[str]:
    """Every file and folder under root, hidden ones too (atomic writes use `.name.*.tmp`)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_nothing_written(root: Path, before: set[str]) -> None:
    """docs/design.md's "nothing half-written": a refused run leaves no checkpoint, metrics,
    samples or temporary file in its output folder (fails if a check ran after the first
    save, or after the metrics file was opened)."""
    after = snapshot(root)
    assert after == before, f"files left behind: {sorted(after - before)}"


def test_unknown_backend_lists_the_known_ones(tmp_path: Path, tiny_vae: Path) -> None:
    result = run_cli(*TRAIN, "--vae_path", str(tiny_vae), "--distributed_backend", "mpi",
                     "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_user_error(result, "unknown --distributed_backend 'mpi'",
                      "single, torch, fsdp, deepspeed, horovod")
    assert_nothing_written(tmp_path, set())


def test_deepspeed_flag_contradicting_another_backend(tmp_path: Path, tiny_vae: Path) -> None:
    result = run_cli(*TRAIN, "--vae_path", str(tiny_vae), "--deepspeed",
                     "--distributed_backend", "torch",
                     "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_user_error(result, "--deepspeed contradicts --distributed_backend torch")
    assert_nothing_written(tmp_path, set())


@pytest.mark.parametrize(("backend", "package", "extra"), [
    ("deepspeed", "deepspeed", "deepspeed"),
    ("horovod", "horovod/torch", "horovod"),
])
def test_engine_that_does_not_import(backend: str, package: str, extra: str, tmp_path: Path,
                                     tiny_vae: Path) -> None:
    """A shadowing package that raises on import stands in for a broken install."""
    fake = tmp_path / "fake"
    parts = Path(package).parts
    for depth in range(1, len(parts) + 1):
        folder = fake.joinpath(*parts[:depth])
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(
            "raise ImportError('libsimulated.so: cannot open shared object file')\n")
    before = snapshot(tmp_path)
    result = run_cli(*TRAIN, "--vae_path", str(tiny_vae), "--distributed_backend", backend,
                     "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path,
                     env={"PYTHONPATH": os.pathsep.join(
                         [str(fake), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert_user_error(result, f"backend {backend} cannot run here", "libsimulated.so",
                      f"pip install 'dalle_dist[{extra}]'", f"dalle-dist check --backend {backend}")
    assert_nothing_written(tmp_path, before)


@pytest.mark.parametrize("backend", ["torch", "fsdp"])
def test_backend_without_a_launcher(backend: str, tmp_path: Path, tiny_vae: Path) -> None:
    result = run_cli(*TRAIN, "--vae_path", str(tiny_vae), "--distributed_backend", backend,
                     "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_user_error(result, f"backend {backend} found no launcher environment", "torchrun")
    assert_nothing_written(tmp_path, set())


@pytest.mark.parametrize(("backend", "batch", "fix"), [
    ("torch", "1", "--batch_size 2 or 4"),
    ("fsdp", "3", "--batch_size 2 or 4"),
    ("deepspeed", "5", "--batch_size 4 or 6"),
])
def test_batch_that_cannot_be_split(backend: str, batch: str, fix: str, tmp_path: Path,
                                    tiny_vae: Path) -> None:
    results = launch.bare_ranks(*TRAIN, "--vae_path", str(tiny_vae), "--distributed_backend",
                                backend, "--batch_size", batch,
                                "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_every_rank(results, f"--batch_size {batch}", "multiple of the 2 ranks", fix)
    assert_nothing_written(tmp_path, set())


def test_batch_error_under_torchrun_returns(tmp_path: Path, tiny_vae: Path) -> None:
    """Through the real launcher: it must come back (timeout otherwise) with the error shown.

    torchrun exits 1 and prints a traceback and a summary of its own when a worker fails,
    so the contract is read off each worker: the summary gives the ranks' status as 2,
    the only `error:` lines are the expected one, no traceback comes from dalle_dist's
    code, and nothing is written (fails on a rank that crashes instead of refusing)."""
    result = launch.torchrun(*TRAIN, "--vae_path", str(tiny_vae), "--distributed_backend",
                             "torch", "--batch_size", "3",
                             "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path,
                             timeout=120)
    text = launch.output(result)
    assert result.returncode != 0, text[-3000:]
    # A rank that torchrun stopped because the other had already failed shows -15.
    codes = re.findall(r"exitcode\s*: (-?\d+) \(pid", text)
    assert "2" in codes and set(codes) <= {"2", "-15"}, text[-3000:]
    line = "error: --batch_size 3 is the global batch of backend torch"
    errors = [s for s in text.splitlines() if s.startswith("error: ")]
    assert errors and all(s.startswith(line) for s in errors), text[-3000:]
    assert not re.search(r'File ".*dalle_dist', text), text[-3000:]
    assert_nothing_written(tmp_path, set())


@pytest.mark.parametrize("flags", [["--precision", "fp16"], ["--fp16"]])
def test_deepspeed_fp16_on_cpu(flags: list[str], tmp_path: Path, tiny_vae: Path) -> None:
    results = launch.bare_ranks(*TRAIN, "--vae_path", str(tiny_vae), "--deepspeed", *flags,
                                "--batch_size", "4", "--dalle_output_file_name",
                                str(tmp_path / "d"), cwd=tmp_path)
    assert_every_rank(results, "DeepSpeed cannot train fp16 on CPU", "--precision bf16")
    assert_nothing_written(tmp_path, set())


def _json(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("config", "fragments"), [
    (None, ["--deepspeed_config", "does not exist"]),
    ('{"zero_optimization": {"stage": 2,}}', ["is not valid JSON", "line 1"]),
    ('{"train_batch_size": 32}', ["sets train_batch_size 32 but --batch_size is 4",
                                  "--batch_size 32"]),
    ('{"train_micro_batch_size_per_gpu": 3}', ["train_batch_size 4 != micro batch 3 x "
                                               "--ga_steps 1 x 2 ranks (6)", "--batch_size 6"]),
    ('{"amp": {"enabled": true, "opt_level": "O1"}}', ["'amp' block", "--precision bf16"]),
    ("[1, 2]", ["must hold a JSON object"]),
], ids=["missing", "invalid-json", "batch-mismatch", "micro-batch", "amp-block", "not-object"])
def test_bad_deepspeed_config(config: str | None, fragments: list[str], tmp_path: Path,
                              tiny_vae: Path) -> None:
    path = tmp_path / "missing.json" if config is None else _json(tmp_path, config)
    before = snapshot(tmp_path)
    results = launch.bare_ranks(*TRAIN, "--vae_path", str(tiny_vae), "--deepspeed",
                                "--deepspeed_config", str(path), "--batch_size", "4",
                                "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_every_rank(results, *fragments)
    assert_nothing_written(tmp_path, before)


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_ga_steps_that_do_not_divide(backend: str, tmp_path: Path, tiny_vae: Path) -> None:
    """--ga_steps on every backend: the global batch must split into ranks x micro-batches
    (8 does not into 2 x 3), checked on every rank before any engine starts."""
    results = launch.bare_ranks(*TRAIN, "--vae_path", str(tiny_vae), "--distributed_backend",
                                backend, "--ga_steps", "3", "--batch_size", "8",
                                "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_every_rank(results, "--batch_size 8", "--ga_steps 3 x 2 ranks (6)",
                      "--batch_size 6 or 12")
    assert_nothing_written(tmp_path, set())


def test_ga_steps_that_do_not_divide_in_one_process(tmp_path: Path, tiny_vae: Path) -> None:
    result = run_cli(*TRAIN, "--vae_path", str(tiny_vae), "--ga_steps", "4", "--batch_size",
                     "10", "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert_user_error(result, "--batch_size 10", "multiple of --ga_steps 4",
                      "--batch_size 8 or 12")
    assert_nothing_written(tmp_path, set())


#: Not `train`'s --learning_rate default (1e-3, the lr this test's JSON used to set, so a
#: run that kept our Adam logged the same lr).
JSON_LR = 7e-4


def test_json_optimizer_wins_with_a_warning(tmp_path: Path, tiny_vae: Path) -> None:
    """DALLE-pytorch's rule: an optimizer in the JSON replaces ours, and the log says so.

    The logged lr is the JSON's at every step: fails if our Adam (or our --learning_rate)
    is still the one that steps while the warning claims otherwise."""
    # torch_adam: DeepSpeed's own Adam is a C++ op compiled on first use (about 10 minutes
    # on 2 cores, again for every venv path).
    config = _json(tmp_path, json.dumps({"optimizer": {"type": "AdamW", "params": {
        "lr": JSON_LR, "torch_adam": True}}}))
    result = launch.deepspeed(*TRAIN, "--vae_path", str(tiny_vae), "--deepspeed",
                              "--deepspeed_config", str(config), "--batch_size", "16",
                              "--log_every_n_steps", "1",
                              "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    text = launch.output(result)
    assert result.returncode == 0, text[-3000:]
    assert text.count("warning: --deepspeed_config defines an optimizer") == 1, "root only"
    records = [json.loads(line) for line in (tmp_path / "d.metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # 64 shapes / batch 16
    assert [r["lr"] for r in records] == [pytest.approx(JSON_LR)] * 4, records
