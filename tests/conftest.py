"""Shared test plumbing: one way to run the CLI as a real process, tiny checkpoints built
once per test run, and how the suite splits over pytest-xdist's workers.

Tiny models keep the suite fast; the built-in VAE's own tests live in
tests/train/test_builtin_vae.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from filelock import FileLock

#: OpenMP threads that wait for each other sleep instead of spinning. By default torch's
#: two threads on two cores busy-wait at every parallel region: alone on the machine that
#: costs little, but next to any other busy process (a launcher's ranks, a second test run,
#: CI's neighbours) each spinning thread steals the core the other one needs. Measured on the
#: 2-core machine under load: a 32px VAE step 3.9 s spinning vs 0.15 s passive, and
#: test_default_path[single] over its 300 s timeout vs 69 s. Thread counts stay as they
#: were, so every result is the same bit for bit. Set before torch is imported (libgomp reads
#: it when loaded), here and in every process the tests start, which inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
#: One thread per process, as torchrun gives each rank: the suite runs two test processes
#: side by side on two cores (make test), so a second thread only waits for a core, and the
#: tiny models' parallel regions cost more to share out than they save. Measured on the
#: 2-core machine beside another job: one epoch of the built-in VAE 54 s of CPU with one
#: thread against 63 s with two. The same for every process, so results still repeat.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if TYPE_CHECKING:
    from tests.backends.runs import Run

#: Every run ends with its wall time and its slowest files and fixtures (tests/timing.py).
pytest_plugins = ["tests.timing"]

#: Test files that spend most of their time in 2-rank launches (torchrun, the deepspeed
#: launcher, horovodrun): marked `ranks`, which `make test-quick` leaves out.
RANK_FILES = frozenset(f"tests/{name}.py" for name in (
    "backends/test_peer_failures", "backends/test_ds_checkpoints", "backends/test_default_path",
    "backends/test_accumulation", "backends/test_equivalence", "backends/test_precision",
    "backends/test_cross_resume", "backends/test_sharing", "backends/test_clipping",
    "backends/test_host_syncs", "backends/test_errors", "backends/test_fp16_agreement",
    "backends/test_node_local_files", "backends/test_multinode", "backends/test_compile",
    "backends/test_sharded_checkpoints", "backends/test_ds_resharding",
    "backends/test_sharded_memory", "backends/test_token_shards", "test_selftest",
    "backends/test_dalle_pytorch_import", "backends/test_quality_ranks", "slurm/test_slurm",
))
#: The longest of them, and those that time a wait (a hung peer, a run stopped after step
#: k): under pytest-xdist (`make test`) one worker runs them first and in this order, so
#: two of these launches never share the two cores (each rank takes one), while the other
#: worker runs the single-process tests beside them.
ONE_AT_A_TIME = tuple(f"tests/backends/{name}.py" for name in (
    "test_peer_failures", "test_ds_checkpoints", "test_default_path", "test_equivalence",
    "test_accumulation", "test_sharing", "test_precision", "test_cross_resume",
    "test_sharded_checkpoints", "test_ds_resharding", "test_sharded_memory",
))
#: The single-process files that take most of a minute or more (marked `slow`, which
#: `make test-quick` leaves out too): queued next, so that none of them is left for the
#: end, when one worker would run it while the other has nothing to do. Then the other
#: launch files, then every short file, to fill the end evenly.
LONG_FILES = tuple(f"tests/{name}.py" for name in (
    "train/test_builtin_vae", "train/test_resume", "cli/test_errors", "cli/test_checkpoint_cmd",
    "train/test_overwrite", "train/test_validation",
))


#: Files that read the same launches, run on one worker (else one waits for the other's).
SAME_WORKER = {"tests/backends/test_clipping.py": "tests/backends/test_host_syncs.py"}


def _test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _queue_place(item: pytest.Item) -> tuple[int, int]:
    path = _test_file(item.nodeid)
    if path in ONE_AT_A_TIME:
        return 0, ONE_AT_A_TIME.index(path)
    if path in LONG_FILES:
        return 1, LONG_FILES.index(path)
    return (2, 0) if path in RANK_FILES else (3, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the launch files' tests `ranks` and the long files' `slow`; under xdist,
    orders the queue (every worker sorts alike: xdist checks that their collections agree)."""
    for item in items:
        if _test_file(item.nodeid) in RANK_FILES:
            item.add_marker(pytest.mark.ranks)
        elif _test_file(item.nodeid) in LONG_FILES:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_queue_place)


@pytest.hookimpl(optionalhook=True)  # (`-p no:xdist` runs the suite without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduling by scope, with these scopes: the ONE_AT_A_TIME files together,
    every other test file on its own (its module-scoped fixtures are then set up once, on
    one worker). Units go out in the collection's order; a worker takes the next one when
    it has at most two tests left.

    (Our own scope rule rather than `--dist loadgroup`: pytest 9 moved the node id that
    xdist 3.8 appends the group name to, and loadgroup silently groups nothing.)"""
    from xdist.scheduler import LoadScopeScheduling

    class LaunchesOneAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = _test_file(nodeid)
            if path in ONE_AT_A_TIME:
                return "one at a time"
            return SAME_WORKER.get(path, path)

    return LaunchesOneAtATime(config, log)


TINY_VAE_FLAGS = [
    "--image_size", "16", "--num_layers", "2", "--num_tokens", "32", "--emb_dim", "16",
    "--hidden_dim", "16", "--num_resnet_blocks", "0",
]
TINY_DALLE_FLAGS = [
    "--dim", "32", "--depth", "2", "--heads", "2", "--dim_head", "16", "--text_seq_len", "40",
]
TINY_TRAIN_FLAGS = ["--epochs", "1", "--batch_size", "16", "--shapes_count", "64"]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """`python -m dalle_dist ARGS` in a fresh process, as a user would run it.

    prefix wraps the command (e.g. setpriv to drop root's privileges).
    """
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*prefix, sys.executable, "-m", "dalle_dist", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=full_env, check=False)


def assert_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """docs/design.md's contract: exit 2, exactly one line `error: ...` on stderr, no traceback.

    The line also goes through `dalle-dist doctor` (tests/diagnose/own_errors.py): a
    reworded message that doctor no longer recognises fails here, in the test that printed it.
    """
    from tests.diagnose.own_errors import check_doctor_reads

    stderr = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith("error: "), stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)
    check_doctor_reads(stderr)
    return stderr


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this test run that every pytest-xdist worker sees (the workers' base
    temporary folders are children of the run's); without xdist, one in the run's own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (root / "shared").mkdir(exist_ok=True)
    return root / "shared" / name


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], None]) -> Path:
    """`build(folder)` once per test run, by whichever worker asks first; the others wait
    under a file lock and reuse what it wrote. A build that fails leaves no mark, so the
    next asker builds again and fails in its own test as well."""
    folder = shared_folder(tmp_path_factory, name)
    built = folder.with_name(f"{name}.built")
    with FileLock(f"{folder}.lock"):
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            built.touch()
    return folder


@pytest.fixture(scope="session")
def quality_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train --fid_weights and --clip_dir's stand-ins (tests/train/quality_files.py):
    FOLDER/tiny.pt and FOLDER/clip/, built once per test run."""
    from tests.train.quality_files import tiny_clip, tiny_extractor

    def build(folder: Path) -> None:
        tiny_extractor(folder / "tiny.pt")
        tiny_clip(folder / "clip")
        (folder / "captions.txt").write_text("a red circle\na blue square\na green triangle\n")
    return build_once(tmp_path_factory, "quality-files", build)


@pytest.fixture(scope="session")
def tiny_vae(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A VAE checkpoint trained for a few steps on 16px shapes, through the CLI."""
    def build(folder: Path) -> None:
        result = run_cli("train-vae", *TINY_VAE_FLAGS, *TINY_TRAIN_FLAGS,
                         "--vae_output_file_name", str(folder / "vae.pt"))
        assert result.returncode == 0, result.stderr
    return build_once(tmp_path_factory, "tiny_vae", build) / "vae.pt"


@pytest.fixture(scope="session")
def tiny_dalle(tmp_path_factory: pytest.TempPathFactory, tiny_vae: Path) -> Path:
    """A DALL-E checkpoint trained for a few steps on top of tiny_vae, through the CLI."""
    def build(folder: Path) -> None:
        result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                         *TINY_TRAIN_FLAGS, "--fidelity_images", "4",
                         "--dalle_output_file_name", str(folder / "dalle.pt"))
        assert result.returncode == 0, result.stderr
    return build_once(tmp_path_factory, "tiny_dalle", build) / "dalle.pt"


@pytest.fixture(scope="session")
def sharp_dalle(tiny_dalle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_dalle's checkpoint (its VAE, tokenizer and configs) with the DALL-E's linear and
    embedding weights re-drawn at std 1: a barely trained model's image logits move by
    hundredths when its input changes, so sampling tests that must see a difference (another
    caption, another precision) use this one, whose logits move by units."""
    def build(folder: Path) -> None:
        import torch
        from torch import nn

        from dalle_dist.generate import load_sampler

        payload = torch.load(tiny_dalle, weights_only=True)
        sampler = load_sampler(tiny_dalle, torch.device("cpu"))
        torch.manual_seed(0)
        for module in sampler.model.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=1.0)
        torch.save({**payload, "weights": sampler.model.state_dict()}, folder / "dalle.pt")
    return build_once(tmp_path_factory, "sharp_dalle", build) / "dalle.pt"


def saved_checkpoint(path: Path) -> dict[str, Any]:
    """What a run saved under the output name `path` (NAME.pt) as a single file's payload:
    the file itself, or the newest save of NAME-sharded/ (fsdp's default format) read
    whole, optimizer included."""
    import torch

    from dalle_dist.checkpoint.sharded_dir import read_sharded_whole, sharded_checkpoint_dir

    if path.is_file():
        return torch.load(path, weights_only=True)
    return read_sharded_whole(sharded_checkpoint_dir(path), "test")


@pytest.fixture(scope="session")
def trained(tiny_vae: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    """(backend name or "single", precision, *extra flags) -> its finished `train` run,
    trained on first use: 2 ranks (1 for single), global batch 16, 5 steps, metrics every
    step, a sample grid every 2 steps (sharded engines gather their weights mid-run for it).

    Shared by the whole test run (every xdist worker reads the same runs): the equivalence
    and precision tests compare precision runs bit for bit with the same backend's fp32
    run, and the checkpoint command's tests read the DeepSpeed fp32 runs' directories
    (tests/backends/runs.py says how each is launched). Tests only read a run's folder.
    """

    from tests.backends.runs import BATCH, COMMON, RUNS, Run, batch_flag, metric_records

    done: dict[tuple[str, ...], Run] = {}

    def get(name: str, precision: str, *extra: str) -> Run:
        key = (name, precision, *extra)
        if key in done:
            return done[key]

        def build(folder: Path) -> None:
            args = ["train", "--vae_path", str(tiny_vae), *COMMON, "--precision", precision,
                    "--sample_every_n_steps", "2",
                    "--dalle_output_file_name", str(folder / "dalle"), *extra]
            if name == "single":
                result = run_cli(*args, "--batch_size", str(BATCH), cwd=folder)
            else:
                launcher, flags = RUNS[name]
                result = launcher(*args, *flags, *batch_flag(name, BATCH), cwd=folder)
            text = result.stdout + result.stderr
            assert result.returncode == 0, text[-4000:]
            (folder / "launch.log").write_text(text)

        # (a flag's value may be a path: keep the folder name one path component; the
        # key's hash keeps two runs whose flags differ past the cut apart)
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:8]
        label = re.sub(r"[^\w.,-]+", "_", f"{name}-{precision}{''.join(extra)}")[:80]
        label = f"{label}-{digest}"
        folder = build_once(tmp_path_factory, f"trained-{label}", build)
        done[key] = Run((folder / "launch.log").read_text(),
                        metric_records(folder / "dalle.metrics.jsonl"),
                        saved_checkpoint(folder / "dalle.pt"), folder)
        return done[key]
    return get


#: Each venv builds torch extensions into its own folder. torch's default,
#: ~/.cache/torch_extensions, is shared by every checkout on the machine: checkouts with
#: different venv paths rebuild DeepSpeed's op over each other, and a build killed in one
#: leaves a lock that torch's FileBaton makes the next checkout wait on forever (CI of
#: stop 16 timed out that way: every test errored at setup after 600 s).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))

#: The op builds in 1-3 minutes on two cores; a lock in this venv's own folder older than
#: this was left by a build that was killed, and nobody will ever remove it.
STALE_LOCK_S = 10 * 60
#: Under pytest-timeout's 600 s, so a stuck build fails with a message that names the lock.
BUILD_TIMEOUT_S = 540


@pytest.fixture(scope="session", autouse=True)
def deepspeed_cpu_ops(request: pytest.FixtureRequest
                      ) -> Iterator[subprocess.Popen[bytes] | None]:
    """DeepSpeed on CPU compiles its shared-memory comm op on first use (1-3 minutes on two
    cores, once per venv): start that build here, in the background, and clear locks that
    a killed build left behind. The 2-rank launch files wait for it (launches_wait_for_
    deepspeed_ops), so no launch's timeout absorbs the compile; the other tests run beside
    it (a DeepSpeed process of theirs started meanwhile waits on torch's build lock). A
    run without launch files (make test-quick) builds nothing."""
    started = time.time()
    if not any(_test_file(item.nodeid) in RANK_FILES for item in request.session.items):
        yield None
        return
    cache = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    for lock in cache.glob("*/lock"):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink(missing_ok=True)
    code = ("from dalle_dist.fileio import quiet_output\n"
            "with quiet_output():\n"
            "    from deepspeed.accelerator import get_accelerator\n"
            "    builder = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
            "    builder is None or builder.load()\n")
    build = subprocess.Popen([sys.executable, "-c", code])
    yield build
    try:  # a build cut short here would leave its lock for the next run to wait on
        build.wait(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        build.kill()
    # Ranks killed by the tests cannot remove their DeepSpeed shared-memory buffers.
    for leftover in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"):
        if leftover.stat().st_mtime >= started:
            leftover.unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def launches_wait_for_deepspeed_ops(request: pytest.FixtureRequest,
                                    deepspeed_cpu_ops: subprocess.Popen[bytes] | None) -> None:
    """A launch file's module fixtures and tests start once DeepSpeed's op is built (module
    scope: autouse fixtures set up before the module's own)."""
    if deepspeed_cpu_ops is None or _test_file(request.node.nodeid) not in RANK_FILES:
        return
    try:
        deepspeed_cpu_ops.wait(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        cache = Path(os.environ["TORCH_EXTENSIONS_DIR"])
        locks = [str(lock) for lock in cache.glob("*/lock")]
        pytest.fail(f"DeepSpeed's CPU op did not build in {BUILD_TIMEOUT_S} s; "
                    f"locks left in {cache}: {locks or 'none'}")
    if deepspeed_cpu_ops.returncode != 0:
        pytest.fail(f"DeepSpeed's CPU op build failed (exit {deepspeed_cpu_ops.returncode}; "
                    "its output is above)")

