"""`train --compile` in one process: every kind of block compiles once, whole, and a
compiled run's losses are the eager run's.

The counting tests run dynamo with the aot_eager backend: whether a block breaks or
recompiles is decided by dynamo's trace and AOTAutograd's forward and backward graphs,
before any backend compiles them, so inductor would only add its C++ compile time (7 to
13 s a graph on this machine with an empty cache). The CLI run uses inductor, the
default, for its numerics.
The 2-rank runs: tests/backends/test_compile.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from dalle_dist.errors import ConfigError
from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.model.config import ComputeConfig
from dalle_dist.train.compile import compile_blocks
from dalle_dist.train.config import ProfileConfig
from dalle_dist.train.job import TrainJob
from tests.backends.runs import COMPILE_PATTERNS, TWENTY_STEPS, Run, assert_compiled_like_eager
from tests.conftest import TINY_DALLE_FLAGS, assert_user_error, run_cli

#: A sitecustomize that empties sysconfig's include path (a Python without Python.h).
NO_HEADERS = Path(__file__).parent / "no_python_headers"


def tiny_dalle(attn_types: tuple[str, ...], attn_impl: str = "auto", **options: bool
               ) -> DALLE:
    """Two blocks of each pattern in `attn_types`, 8 text and 16 image tokens."""
    torch.manual_seed(0)
    config = DALLEConfig(num_text_tokens=50, text_seq_len=8, num_image_tokens=32,
                         image_fmap_size=4, dim=32, depth=2 * len(attn_types), heads=2,
                         dim_head=16, attn_types=attn_types, **options)
    return DALLE(config, attn_impl)


BAND_PATTERNS = ("axial_row", "axial_col", "conv_like", "sparse")


@pytest.mark.parametrize(("attn_types", "options", "checkpointing", "attn_impl"), [
    (("full", "axial_row"), {}, False, "auto"),
    (("full", "axial_row"), {}, True, "auto"),
    (("full", *BAND_PATTERNS), {"rotary_emb": True, "shift_tokens": True}, True, "auto"),
    (BAND_PATTERNS, {}, True, "gather"),
    (BAND_PATTERNS, {}, False, "matmul"),
], ids=["full-axial_row", "checkpointed", "every-pattern-rotary-shift-checkpointed",
        "gathers-checkpointed", "band-matmuls"])
def test_each_kind_of_block_compiles_once_without_a_break(
        attn_types: tuple[str, ...], options: dict[str, bool], checkpointing: bool,
        attn_impl: str) -> None:
    """Two blocks of each pattern, 4 training steps: one graph per pattern (blocks alike
    share it), no graph break and no recompile (dynamo's own counters, and ours); then a
    validation forward and cached sampling stay eager (no graph more). Bugs: a block
    compiled without its eager warm-up traces the attention's mask cache and compiles
    again at the next call (3 graphs for 2 patterns); compiling the whole model or its
    forward breaks at the loss or recompiles per call; skipping compile leaves 0 graphs;
    the axial band gather building its CausalBias inside the graph (dynamo cannot: the
    layer keeps one, built eagerly). Each --attn_impl that trains on CPU: auto (SDPA at
    this grid), the gathers and the band matmuls."""
    torch._dynamo.reset()
    counters.clear()
    model = tiny_dalle(attn_types, attn_impl, **options)
    model.transformer.set_checkpointing(checkpointing)
    compiled = compile_blocks(model.transformer, "aot_eager")
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    text, images = torch.randint(1, 50, (2, 8)), torch.randint(0, 32, (2, 16))
    for _ in range(4):
        model(text, images)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
    kinds = len(attn_types)
    assert compiled.blocks == 2 * kinds
    assert compiled.graphs == kinds, "one graph per kind of block"
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == kinds, "a recompile is one graph more"
    model.eval()
    with torch.no_grad():
        model(text, images)
    model.sample_image_tokens(text[:1])
    assert compiled.graphs == kinds, "validation and sampling stay eager"


def test_compiled_losses_equal_eager_in_one_process(trained: Callable[..., Run]) -> None:
    """20 steps with --compile (inductor) against the same 20 eager: losses, gradient
    norms and weights within fp32 rounding, and the log's one compile line. Bugs: a
    compiled block whose output is off by 1e-4 (weights 1.2e-5 away); a --compile that
    compiled nothing has no compile line."""
    eager = trained("single", "fp32", *COMPILE_PATTERNS, *TWENTY_STEPS)
    run = trained("single", "fp32", *COMPILE_PATTERNS, *TWENTY_STEPS, "--compile")
    assert_compiled_like_eager(run, eager, "inductor", blocks=2, graphs=2)


@pytest.mark.parametrize(("compute", "profile", "fragment"), [
    (ComputeConfig(compile_backend="aot_eager"), ProfileConfig(),
     "--compile_backend aot_eager without --compile"),
    (ComputeConfig(compile=True), ProfileConfig(flops_profiler=True),
     "--flops_profiler cannot count a compiled step"),
], ids=["backend-without-compile", "flops-profiler"])
def test_flags_that_cannot_apply_are_refused_before_launch(
        compute: ComputeConfig, profile: ProfileConfig, fragment: str) -> None:
    """TrainJob.validate, which the CLI runs before any process group or file."""
    with pytest.raises(ConfigError, match=fragment):
        TrainJob(compute=compute, profile=profile).validate()


def test_a_missing_cpp_compiler_is_refused_before_training(tmp_path: Path,
                                                           tiny_vae: Path) -> None:
    """A real `train --compile` run that cannot compile: CXX names no compiler (inductor
    reads it when it loads). One error line, exit 2, nothing written, instead of a
    traceback at the first compiled step. Bug: a check that probed nothing."""
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--compile",
                     "--shapes_count", "64", "--dalle_output_file_name",
                     str(tmp_path / "d"), cwd=tmp_path, env={"CXX": str(tmp_path / "no-such-g++")})
    assert_user_error(result, "--compile: inductor needs a C++ compiler on CPU",
                      "--compile_backend aot_eager")
    assert not list(tmp_path.iterdir())


def test_a_python_without_its_headers_is_refused_before_training(tmp_path: Path,
                                                                 tiny_vae: Path) -> None:
    """A Python without its -dev package (sysconfig's include folder empty: tests/train/
    no_python_headers). inductor builds its kernels as Python extensions, so a run there
    fails at its first compiled step with "fatal error: Python.h: No such file or
    directory" (as torch.compile of one sin() does in this environment: 13 s with an empty
    inductor cache, so not repeated here). Bug: a check that looked for the C++ compiler
    only. `check` names the same gap."""
    empty = tmp_path / "include"
    empty.mkdir()
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(NO_HEADERS),
                                                        os.environ.get("PYTHONPATH")])),
           "NO_HEADERS_DIR": str(empty)}
    out = tmp_path / "run"
    out.mkdir()
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--compile",
                     "--shapes_count", "64", "--dalle_output_file_name", str(out / "d"),
                     cwd=out, env=env)
    assert_user_error(result, "--compile: inductor needs Python's headers on CPU: no Python.h "
                      f"in {empty}", "-dev", "--compile_backend aot_eager")
    assert not list(out.iterdir())
    check = run_cli("check", env=env)
    assert "torch.compile inductor on cpu: needs Python's headers" in check.stdout, check.stdout


@pytest.mark.parametrize(("samples", "line"), [
    ("32", "compile: 2 transformer blocks -> 1 graph(s) (aot_eager): step 2 took "),
    ("16", "--compile: nothing was compiled: the run ended after its first step"),
], ids=["two-steps", "one-step"])
def test_a_run_too_short_to_time_the_compile_still_reports_it(
        samples: str, line: str, tmp_path: Path, tiny_vae: Path) -> None:
    """A run of 2 steps ends with the compiling step, before the step that would time the
    compile alone; one of 1 step runs eager only. Each still logs one compile line at its
    end: the compiling step's time, or that nothing compiled. Bug: the report waited for
    a third step, so a short run (a first try, a smoke test) never said what compiling
    cost, or that it never compiled."""
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--compile",
                     "--compile_backend", "aot_eager", "--epochs", "1", "--batch_size", "16",
                     "--shapes_count", samples, "--fidelity_images", "0",
                     "--dalle_output_file_name", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    reports = [text for text in result.stdout.splitlines()
               if text.startswith(("compile:", "--compile: nothing"))]
    assert len(reports) == 1 and reports[0].startswith(line), reports


def test_checkpoints_keep_the_eager_names() -> None:
    """Blocks compile in place (no `_orig_mod.` wrapper): a compiled model's state dict
    is an eager one's, so checkpoints of either load into the other, strictly. Bug: a
    block replaced by torch.compile(block) (its names gain `_orig_mod.`)."""
    model = tiny_dalle(("full",))
    eager = model.state_dict()
    compile_blocks(model.transformer, "aot_eager")
    assert list(model.state_dict()) == list(eager)
    model.load_state_dict(eager, strict=True)
    tiny_dalle(("full",)).load_state_dict(model.state_dict(), strict=True)
