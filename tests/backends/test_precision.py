"""--precision on every backend, proven applied rather than merely accepted.

A precision flag that is silently dropped (autocast never entered, DeepSpeed's
torch_autocast section left disabled, the gradient scaler never stepping) still trains, so
"it ran" is no evidence. Each run here (the trained fixture, tests/conftest.py: 2 ranks, 5
steps) must show:
- the dtype its matmuls really produced on the first step (the loop logs it from forward
  hooks on the linear layers);
- results close to the same backend's fp32 run but not bit-identical to it (fp32 runs
  repeat bit for bit: same seed, same data, same reduction order);
- for fp16, a loss scaler that stepped every step: its growth count in the checkpoint
  equals the step count, the scale is logged, and a resumed run continues the count.
bf16 runs on every backend; fp16 on every backend but DeepSpeed, which refuses it on CPU.
DeepSpeed's bf16 must compute as DDP's does (fp32 weights, norms and loss: the dtypes its
forward hooks saw, tests/backends/dtype_probe.py), and its config must let a JSON tune the
precision sections but not choose the precision.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.backends.deepspeed import DeepSpeedBackend
from dalle_dist.errors import ConfigError
from tests.backends.runs import (
    STEPS,
    Run,
    assert_ranks_consistent,
    assert_weights_close,
    metric_records,
)
from tests.conftest import TINY_DALLE_FLAGS, run_cli

#: torch's GradScaler starts at 2**16 and grows only after 2000 clean steps.
INITIAL_SCALE = 2.0 ** 16
BF16 = ["single", "torch", "fsdp", "deepspeed-zero2", "horovod"]
FP16 = ["single", "torch", "fsdp", "horovod"]


def assert_close_not_identical(run: Run, fp32: Run, rtol: float, atol: float,
                               most_within: float = 1e-2, share: float = 0.1) -> None:
    """Close to fp32: every loss to rtol, the weights to atol and all but `share` of each
    tensor's elements to `most_within`, all finite, still learning. Not identical: some
    weight differs from the fp32 run's (fp32 in disguise repeats it bit for bit)."""
    assert len(run.losses) == STEPS and all(math.isfinite(x) for x in run.losses)
    assert run.losses == pytest.approx(fp32.losses, rel=rtol)
    assert run.losses[-1] < run.losses[0], "still learns"
    weights, expected = run.payload["weights"], fp32.payload["weights"]
    assert any(not torch.equal(weights[k].float(), expected[k].float()) for k in expected), \
        "bit-identical to the fp32 run: the precision was not applied"
    assert_weights_close(weights, expected, rtol=0, atol=atol)
    for key, tensor in expected.items():
        off = ((weights[key].float() - tensor.float()).abs() > most_within).float().mean()
        assert off <= share, f"{key}: {off:.1%} of its elements are > {most_within} off fp32"


@pytest.mark.parametrize("name", BF16)
def test_bf16_is_applied(name: str, trained: Callable[[str, str], Run]) -> None:
    run = trained(name, "bf16")
    assert "precision bf16: the first step's matmuls ran in bfloat16" in run.text
    assert_ranks_consistent(name, run.text, world=1 if name == "single" else 2)
    # atol 3e-2: the frozen VAE encodes under the run's autocast too, so about 1% of the
    # bf16 run's image tokens differ from the fp32 run's, and with bf16 rounding a few
    # weights end up to 2.5e-2 apart after 5 Adam steps of 3e-3 (observed on every
    # backend; at most 3.1% of a tensor's elements more than 1e-2 apart). Precision not
    # applied is bit-identical; a broken step moves most elements, not a few percent.
    assert_close_not_identical(run, trained(name, "fp32"), rtol=1e-2, atol=3e-2)
    assert run.payload["precision"] == "bf16"


def forward_dtypes(run: Run) -> dict[str, list[str]]:
    """What the first step's forward computed in (tests/backends/dtype_probe.py's line)."""
    lines = re.findall(r"dtype probe: (\{.*\})", run.text)
    assert len(lines) == 1, "the root rank prints one dtype probe line"
    return json.loads(lines[0])


#: bf16's machine epsilon (2**-7): a number computed or rounded in bf16 is off by up to half.
BF16_EPS = torch.finfo(torch.bfloat16).eps


def test_deepspeed_bf16_computes_as_ddp_bf16(trained: Callable[[str, str], Run]) -> None:
    """DeepSpeed's bf16 runs DDP's autocast: matmuls in bf16; parameters (the master
    weights), LayerNorm outputs and the loss (cross_entropy's log-softmax) in fp32, as the
    forward hooks of tests/backends/dtype_probe.py saw them; fp32 weights saved.

    Same weights, data and forward: the losses and gradient norms agree far inside one bf16
    rounding (BF16_EPS / 32 relative; observed: equal but for one norm 1e-7 apart, from
    the two engines' fp32 reductions). DeepSpeed's bf16 section, which casts the module,
    fails every line here: its parameters, norms and loss are bfloat16, and its losses
    are 3.6e-3 (BF16_EPS / 2.2) off DDP's on the first step.
    """
    ds, ddp = trained("deepspeed-zero2", "bf16"), trained("torch", "bf16")
    for run in (ds, ddp):
        assert "precision bf16: the first step's matmuls ran in bfloat16" in run.text
        assert forward_dtypes(run) == {"params": ["float32"], "norms": ["float32"],
                                       "loss": ["float32"]}
    assert {str(w.dtype) for w in ds.payload["weights"].values()} == {"torch.float32"}
    assert ds.losses == pytest.approx(ddp.losses, rel=BF16_EPS / 32, abs=0)
    assert ds.grad_norms == pytest.approx(ddp.grad_norms, rel=BF16_EPS / 32, abs=0)


def deepspeed_config(precision: str, folder: Path, json_config: dict | None = None) -> dict:
    """The DeepSpeed config `train --deepspeed --precision PRECISION` builds (one rank)."""
    path = None
    if json_config is not None:
        path = folder / "ds.json"
        path.write_text(json.dumps(json_config))
    backend = DeepSpeedBackend(DistributedConfig(deepspeed=True, precision=precision,
                                                 deepspeed_config=str(path) if path else None))
    return backend.build_config(16, 0.5)


@pytest.mark.parametrize(("precision", "sections"), [
    ("bf16", {"bf16": {"enabled": False}, "fp16": {"enabled": False},
              "torch_autocast": {"enabled": True, "dtype": "bfloat16",
                                 "lower_precision_safe_modules": []}}),
    ("fp16", {"bf16": {"enabled": False}, "fp16": {"enabled": True},
              "torch_autocast": {"enabled": False}}),
    ("fp32", {"bf16": {"enabled": False}, "fp16": {"enabled": False},
              "torch_autocast": {"enabled": False}}),
])
def test_deepspeed_precision_sections(precision: str, sections: dict, tmp_path: Path) -> None:
    """What each --precision writes (deepspeed.py's docstring says why); a JSON's other keys
    in those sections are kept (fp16's loss scaling, torch_autocast's module list)."""
    tuned = {"fp16": {"initial_scale_power": 12},
             "torch_autocast": {"lower_precision_safe_modules": ["torch.nn.Linear"]}}
    config = deepspeed_config(precision, tmp_path)
    assert {key: config[key] for key in sections} == sections
    config = deepspeed_config(precision, tmp_path, tuned)
    assert config["fp16"] == {**sections["fp16"], "initial_scale_power": 12}
    assert config["torch_autocast"] == {**sections["torch_autocast"],
                                        "lower_precision_safe_modules": ["torch.nn.Linear"]}


@pytest.mark.parametrize(("precision", "json_config", "said"), [
    ("bf16", {"bf16": {"enabled": True}}, "sets bf16.enabled true, but --precision bf16 "
                                         "runs DeepSpeed with bf16.enabled false"),
    ("bf16", {"fp16": {"enabled": True}}, "sets fp16.enabled true, but --precision bf16"),
    ("fp32", {"torch_autocast": {"enabled": True}}, "sets torch_autocast.enabled true"),
    ("fp16", {"torch_autocast": {"dtype": "fp16"}}, "sets torch_autocast.dtype fp16, but "
                                                    "--precision fp16 writes no torch_autocast"),
])
def test_deepspeed_json_may_not_choose_the_precision(precision: str, json_config: dict,
                                                      said: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        deepspeed_config(precision, tmp_path, json_config)
    assert said in str(error.value) and "choose the precision with --precision" in \
        str(error.value)
    assert "\n" not in str(error.value)
    # the same value as ours, or the same dtype by another of DeepSpeed's names, is fine
    deepspeed_config("bf16", tmp_path, {"bf16": {"enabled": False}, "torch_autocast": {
        "enabled": True, "dtype": "bf16"}})


def test_fsdp_bf16_equals_ddp_bf16(trained: Callable[[str, str], Run]) -> None:
    """FSDP's shards, put together, hold what DDP's replicas hold: a shard updated wrongly
    or not at all shows here (its digests cannot: they differ by design).

    Not to fp32's 1e-5: FSDP gathers its parameters in bf16 (MixedPrecisionPolicy), so
    its embeddings and norms compute from bf16 weights where DDP's autocast reads fp32
    ones, and the two runs differ less than bf16 differs from fp32 (observed: at most
    8.2e-3; by more than 1e-3 in at most 12.5% of a tensor's elements, 4 of a LayerNorm's
    32, where DDP bf16 and DDP fp32 differ in up to 33%). A shard that missed its updates
    differs in its half of every tensor instead: Adam moves every weight by the learning
    rate (3e-3) on its first step. Broken on purpose (rank 1's optimizer stepped at
    learning rate 0): a to_qkv weight 2.0e-2 off DDP's.
    """
    got = trained("fsdp", "bf16").payload["weights"]
    expected = trained("torch", "bf16").payload["weights"]
    assert_weights_close(got, expected, rtol=0, atol=2e-2)
    for key, tensor in expected.items():
        off = ((got[key].float() - tensor.float()).abs() > 1e-3).float().mean().item()
        assert off <= 0.25, f"{key}: {off:.1%} of its elements differ from DDP's by > 1e-3"


@pytest.mark.parametrize("name", FP16)
def test_fp16_is_applied_with_a_stepping_loss_scaler(name: str,
                                                     trained: Callable[[str, str], Run]) -> None:
    run = trained(name, "fp16")
    assert "precision fp16: the first step's matmuls ran in float16" in run.text
    assert_close_not_identical(run, trained(name, "fp32"), rtol=1e-3, atol=2e-2)
    scaler = run.payload["scaler"]
    assert scaler["scale"] == INITIAL_SCALE, "no overflow expected in this tiny run"
    assert scaler["_growth_tracker"] == STEPS, "scaler.update() ran once per step"
    assert [r["loss_scale"] for r in run.metrics] == [INITIAL_SCALE] * STEPS


def test_fp16_resume_continues_the_loss_scaler(tiny_vae: Path, tmp_path: Path) -> None:
    """A resumed run must not restart its scaler (a reset scale overflows again and skips
    steps the uninterrupted run took): the growth count continues, and the run ends bit
    for bit where the uninterrupted run ends."""
    def train(name: str, *extra: str) -> dict:
        result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--fp16",
                         "--shapes_count", "32", "--batch_size", "8", "--fidelity_images", "0",
                         "--log_every_n_steps", "1", "--dalle_output_file_name", name, *extra,
                         cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return torch.load(tmp_path / f"{name}.pt", weights_only=True)

    whole = train("whole", "--epochs", "2")
    assert whole["scaler"]["_growth_tracker"] == 8
    assert train("half", "--epochs", "1")["scaler"]["_growth_tracker"] == 4
    resumed = train("half", "--epochs", "2", "--resume", "auto")
    assert resumed["scaler"] == whole["scaler"]
    assert_weights_close(resumed["weights"], whole["weights"], rtol=0, atol=0)
    logged = metric_records(tmp_path / "half.metrics.jsonl")
    assert [r["step"] for r in logged] == list(range(1, 9))


def test_amp_on_cpu_falls_back_to_native_fp16_and_says_so(tiny_vae: Path, tmp_path: Path
                                                          ) -> None:
    result = run_cli("train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, "--amp",
                     "--epochs", "1", "--batch_size", "16", "--shapes_count", "64",
                     "--fidelity_images", "0", "--dalle_output_file_name", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("--amp:")]
    assert lines == ["--amp: Apex amp needs CUDA and this run is on cpu; using torch.autocast "
                     "fp16 with a gradient scaler instead"]
    assert "precision fp16: the first step's matmuls ran in float16" in result.stdout
