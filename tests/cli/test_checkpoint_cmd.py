"""`dalle-dist checkpoint inspect | convert | verify | export`, as real processes.

DeepSpeed directories come from real 2-rank CPU runs (the deepspeed launcher, ZeRO 1, 2
and 3, one launch per stage): the session's fp32 runs that the backend equivalence tests
compare (the `trained` fixture, tests/conftest.py), so a full run launches them once. The
run also writes its module weights as a single file (dalle.pt), which is what a converted
directory must equal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from dalle_dist.checkpoint.export import load_exported
from dalle_dist.checkpoint.load import dalle_parts, vae_from_checkpoint
from dalle_dist.errors import CheckpointError
from dalle_dist.model import DALLE
from tests.backends.runs import STEPS, Run
from tests.conftest import assert_user_error, run_cli

INSPECT_KEYS = {
    "path", "format", "zero_stage", "tag", "tags", "kind", "step", "epoch", "batch",
    "backend", "world_size", "package_version", "format_version", "configs", "parameters",
    "weights", "optimizer", "scheduler", "converted_from", "size_bytes", "tag_sizes",
}


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def numel(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() for t in state.values())


def inspect_json(path: Path, env: dict[str, str] | None = None) -> dict:
    result = run_cli("checkpoint", "inspect", str(path), "--json", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # one JSON object, nothing else on stdout
    return json.loads(lines[0])


@pytest.fixture
def ds_run(trained: Callable[..., Run]) -> Callable[[int], Path]:
    """stage -> the folder of a finished 2-rank DeepSpeed run at that ZeRO stage (the
    session's fp32 run, launched on first use): dalle.pt and dalle-ds-cp/ inside."""
    return lambda stage: trained(f"deepspeed-zero{stage}", "fp32").folder


def tampered(source: Path, out: Path, change: Callable[[dict], None]) -> Path:
    payload = load(source)
    change(payload)
    torch.save(payload, out)
    return out


# -- inspect ----------------------------------------------------------------------------


def test_inspect_single_file_json(tiny_dalle: Path) -> None:
    payload = load(tiny_dalle)
    info = inspect_json(tiny_dalle)
    assert set(info) == INSPECT_KEYS
    assert info["format"] == "file" and info["kind"] == "dalle"
    assert info["zero_stage"] is None and info["tag"] is None and info["tags"] == []
    assert info["step"] == payload["step"] > 0
    assert (info["epoch"], info["batch"]) == (payload["epoch"], payload["batch"])
    assert (info["backend"], info["world_size"]) == ("single", 1)
    assert info["format_version"] == payload["format_version"]
    assert info["configs"]["model"] == payload["configs"]["model"]
    assert info["configs"]["vae"] == payload["configs"]["vae"]
    # Parameter counts come from the model built on the meta device; they must agree
    # with what the file holds.
    assert info["parameters"] == {"dalle": numel(payload["weights"]),
                                  "vae": numel(payload["vae_weights"])}
    assert info["weights"]["dalle"] == {
        "tensors": len(payload["weights"]), "elements": numel(payload["weights"]),
        "bytes": 4 * numel(payload["weights"]), "dtypes": {"float32": numel(payload["weights"])}}
    assert info["optimizer"] is (payload["optimizer"] is not None) is True
    assert info["size_bytes"] == tiny_dalle.stat().st_size


def test_inspect_human_output_is_aligned(tiny_vae: Path) -> None:
    payload = load(tiny_vae)
    result = run_cli("checkpoint", "inspect", str(tiny_vae))
    assert result.returncode == 0, result.stderr
    rows = [re.match(r"^(\S.*?)( {2,})(\S.*)$", line) for line in result.stdout.splitlines()]
    assert all(rows), result.stdout
    values = {row.group(1): row.group(3) for row in rows}
    assert values["kind"] == "vae"
    assert values["format"] == "single file"
    assert values["step"] == f"{payload['step']} (epoch {payload['epoch']}, batch 0)"
    assert values["vae parameters"] == f"{numel(payload['weights']):,}"
    assert values["optimizer state"] == "yes"
    assert values["size"] == f"{tiny_vae.stat().st_size:,} bytes"
    # labels padded to one width: every value starts in the same column
    assert len({row.start(3) for row in rows}) == 1, result.stdout


def test_inspect_deepspeed_dir_without_deepspeed(ds_run: Callable[[int], Path],
                                                 tmp_path: Path) -> None:
    """A DeepSpeed directory is described from auxiliary.pt and file sizes: inspect works
    where importing deepspeed would fail, so it cannot have consolidated the weights."""
    folder = ds_run(3)
    poison = tmp_path / "deepspeed"
    poison.mkdir()
    (poison / "__init__.py").write_text("raise ImportError('inspect imported deepspeed')\n")
    info = inspect_json(folder / "dalle-ds-cp", env={"PYTHONPATH": str(tmp_path)})
    module_weights = load(folder / "dalle.pt")["weights"]
    assert set(info) == INSPECT_KEYS
    assert info["format"] == "deepspeed" and info["zero_stage"] == 3
    assert info["tag"] == f"global_step{STEPS}"
    assert info["tags"] == ["global_step0", f"global_step{STEPS}"]
    assert (info["step"], info["backend"], info["world_size"]) == (STEPS, "deepspeed", 2)
    assert info["parameters"]["dalle"] == numel(module_weights)
    assert info["weights"]["dalle"] is None  # left in DeepSpeed's partitions, unread
    assert info["weights"]["vae"]["tensors"] > 0
    assert info["optimizer"] is True
    files = [p for p in (folder / "dalle-ds-cp").rglob("*") if p.is_file()]
    assert info["size_bytes"] == sum(p.stat().st_size for p in files)
    assert info["tag_sizes"][info["tag"]] == sum(  # (the EMA's ema/ shards included)
        p.stat().st_size for p in (folder / "dalle-ds-cp" / info["tag"]).rglob("*")
        if p.is_file())


# -- convert ----------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_convert_equals_the_runs_module_weights(stage: int, ds_run: Callable[[int], Path],
                                                tmp_path: Path) -> None:
    folder = ds_run(stage)
    out = tmp_path / "converted.pt"
    result = run_cli("checkpoint", "convert", str(folder / "dalle-ds-cp"), str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {out}: dalle from tag global_step{STEPS} (step {STEPS}, ZeRO-{stage})" \
        in result.stdout
    converted, module = load(out), load(folder / "dalle.pt")
    state = converted["optimizer"]["state"]
    assert state.keys() == module["weights"].keys()  # Adam's moments for every weight
    for key, moments in state.items():
        assert int(moments["step"]) == STEPS, key
        assert moments["exp_avg"].shape == moments["exp_avg_sq"].shape \
            == module["weights"][key].shape, key
        assert torch.all(moments["exp_avg_sq"] >= 0), key
    assert converted["converted_from"]["tag"] == f"global_step{STEPS}"
    for key in ("kind", "step", "epoch", "configs", "world_size", "backend", "zero_stage"):
        assert converted[key] == module[key], key
    assert converted["weights"].keys() == module["weights"].keys()
    for key, expected in module["weights"].items():
        got = converted["weights"][key]
        assert got.dtype == torch.float32, key
        assert torch.allclose(got, expected.float(), rtol=0, atol=1e-6), (
            key, (got - expected.float()).abs().max().item())
    for key, expected in module["vae_weights"].items():
        assert torch.equal(converted["vae_weights"][key], expected), key
    verified = run_cli("checkpoint", "verify", str(out))
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith(f"ok: dalle checkpoint {out}, step {STEPS}:")


def test_convert_refuses_existing_output_unless_forced(ds_run: Callable[[int], Path],
                                                       tmp_path: Path) -> None:
    ds_dir, out = ds_run(1) / "dalle-ds-cp", tmp_path / "out.pt"
    out.write_bytes(b"keep me")
    assert_user_error(run_cli("checkpoint", "convert", str(ds_dir), str(out)),
                      f"OUT {out} already exists", "--force")
    assert out.read_bytes() == b"keep me"
    result = run_cli("checkpoint", "convert", str(ds_dir), str(out), "--force")
    assert result.returncode == 0, result.stderr[-3000:]
    assert load(out)["step"] == STEPS


def test_convert_refuses_what_is_not_a_deepspeed_dir(tiny_dalle: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    assert_user_error(run_cli("checkpoint", "convert", str(tiny_dalle), str(out), "--to", "file"),
                      f"SOURCE {tiny_dalle} is already a single-file dalle checkpoint")
    assert_user_error(run_cli("checkpoint", "convert", str(tmp_path), str(out)),
                      f"SOURCE {tmp_path} is a folder with no 'latest' file")
    assert_user_error(run_cli("checkpoint", "convert", str(tmp_path / "nope"), str(out)),
                      "does not exist")
    assert list(tmp_path.iterdir()) == []


# -- verify -----------------------------------------------------------------------------


def test_verify_accepts_a_trained_checkpoint(tiny_dalle: Path) -> None:
    payload = load(tiny_dalle)
    result = run_cli("checkpoint", "verify", str(tiny_dalle))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"ok: dalle checkpoint {tiny_dalle}, step {payload['step']}: "
        f"dalle {numel(payload['weights']):,} + vae {numel(payload['vae_weights']):,} "
        "values; names and shapes match the configs, all finite")


def _nan(payload: dict) -> None:
    payload["weights"]["transformer.blocks.1.ff.to_gate.weight"].view(-1)[7] = float("nan")


def _wrong_shape(payload: dict) -> None:
    payload["weights"]["to_logits.bias"] = torch.zeros(5)


def _renamed(payload: dict) -> None:
    weights = payload["weights"]
    for key in sorted(weights)[:6]:
        weights[f"old.{key}"] = weights.pop(key)


def _vae_inf(payload: dict) -> None:
    payload["vae_weights"]["codebook.weight"][0, 0] = float("inf")


@pytest.mark.parametrize(("change", "fragments"), [
    (_nan, ["dalle weight transformer.blocks.1.ff.to_gate.weight holds NaN or inf"]),
    (_wrong_shape, ["dalle weights do not match its config: wrong shape to_logits.bias [5] "
                    "(config gives ["]),
    (_renamed, ["dalle weights do not match its config: missing ", "(+2 more)",
                "; unexpected old."]),
    (_vae_inf, ["vae weight codebook.weight holds NaN or inf"]),
], ids=["nan", "shape", "renamed", "vae-inf"])
def test_verify_names_what_was_tampered(change: Callable[[dict], None], fragments: list[str],
                                        tiny_dalle: Path, tmp_path: Path) -> None:
    bad = tampered(tiny_dalle, tmp_path / "bad.pt", change)
    assert_user_error(run_cli("checkpoint", "verify", str(bad)), f"PATH {bad}", *fragments)


def test_inspect_does_not_judge_values(tiny_dalle: Path, tmp_path: Path) -> None:
    """inspect looks at shapes and dtypes only: a file with NaN weights still inspects."""
    bad = tampered(tiny_dalle, tmp_path / "bad.pt", _nan)
    assert inspect_json(bad)["parameters"] == inspect_json(tiny_dalle)["parameters"]


# -- export -----------------------------------------------------------------------------


def test_export_writes_safetensors_and_json(tiny_dalle: Path, tmp_path: Path) -> None:
    payload = load(tiny_dalle)
    result = run_cli("checkpoint", "export", str(tiny_dalle), str(tmp_path / "model"),
                     "--safetensors")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.safetensors"]
    tensors = load_file(tmp_path / "model.safetensors")
    expected = {**{f"dalle.{k}": v for k, v in payload["weights"].items()},
                **{f"vae.{k}": v for k, v in payload["vae_weights"].items()}}
    assert tensors.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(tensors[key], tensor), key
    description = json.loads((tmp_path / "model.json").read_text())
    assert description["kind"] == "dalle" and description["step"] == payload["step"]
    assert description["weights_file"] == "model.safetensors"
    assert description["configs"] == {k: payload["configs"][k]
                                      for k in ("model", "vae", "tokenizer")}
    assert description["package_version"] == payload["package_version"]

    # A second export to the same name is refused, and the files are left as they were.
    before = (tmp_path / "model.safetensors").read_bytes()
    assert_user_error(run_cli("checkpoint", "export", str(tiny_dalle), str(tmp_path / "model")),
                      "already exists", "--force")
    assert (tmp_path / "model.safetensors").read_bytes() == before


def test_exported_model_gives_the_same_logits(tiny_dalle: Path, tmp_path: Path) -> None:
    result = run_cli("checkpoint", "export", str(tiny_dalle), str(tmp_path / "m.safetensors"))
    assert result.returncode == 0, result.stderr
    payload = load(tiny_dalle)
    exported = load_exported(tmp_path / "m.json")
    assert load_exported(tmp_path / "m.safetensors").keys() == exported.keys()

    models = []
    for source in (payload, exported):
        config, vae, tokenizer = dalle_parts(source)
        model = DALLE(config)
        model.load_state_dict(source["weights"])
        models.append((model.eval(), vae.eval(), tokenizer))
    (model_a, vae_a, tok_a), (model_b, vae_b, tok_b) = models
    assert model_a.config == model_b.config
    assert tok_a.encode("a red circle") == tok_b.encode("a red circle")

    gen = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 16, 16, generator=gen)
    tokens = vae_a.get_codebook_indices(images)
    assert torch.equal(tokens, vae_b.get_codebook_indices(images))
    text = torch.randint(1, 200, (3, model_a.config.text_seq_len), generator=gen)

    def logits(model: DALLE) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        hook = model.transformer.register_forward_hook(lambda m, i, out: seen.append(out))
        with torch.no_grad():
            model(text, tokens)
        hook.remove()
        return F.linear(seen[0], model.to_logits.weight, model.to_logits.bias)

    a, b = logits(model_a), logits(model_b)
    assert a.abs().sum() > 0
    assert torch.equal(a, b)


def test_export_of_a_vae_has_only_vae_weights(tiny_vae: Path, tmp_path: Path) -> None:
    result = run_cli("checkpoint", "export", str(tiny_vae), str(tmp_path / "vae"))
    assert result.returncode == 0, result.stderr
    weights = load(tiny_vae)["weights"]
    tensors = load_file(tmp_path / "vae.safetensors")
    assert tensors.keys() == {f"vae.{k}" for k in weights}
    exported = load_exported(tmp_path / "vae.json")
    assert exported["kind"] == "vae"
    vae = vae_from_checkpoint(exported)
    for key, tensor in vae.state_dict().items():
        assert torch.equal(tensor, weights[key]), key


def test_load_exported_refuses_what_is_not_an_export(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_exported(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(CheckpointError, match="is not a dalle_dist export"):
        load_exported(tmp_path / "other.safetensors")


def test_generate_samples_from_an_export_as_from_the_checkpoint(tiny_dalle: Path,
                                                                tmp_path: Path) -> None:
    """Same seed, same images: the export holds everything sampling needs, without pickle."""
    assert run_cli("checkpoint", "export", str(tiny_dalle), str(tmp_path / "m"),
                   "--safetensors").returncode == 0
    images = {}
    for name, source in (("pt", tiny_dalle), ("export", tmp_path / "m.safetensors")):
        result = run_cli("generate", "--dalle_path", str(source), "--text", "a red circle",
                         "--num_images", "2", "--batch_size", "2", "--seed", "3",
                         "--outputs_dir", str(tmp_path / name))
        assert result.returncode == 0, result.stderr
        images[name] = sorted(p.read_bytes() for p in (tmp_path / name).rglob("*.png"))
    assert images["pt"] == images["export"] and len(images["pt"]) == 3
