"""`dalle-dist checkpoint export`: inference weights as safetensors plus a JSON config.

`load_exported` reads them back without pickle into a payload that
`checkpoint.load.dalle_parts` accepts, so an export is enough to sample.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dalle_dist import __version__
from dalle_dist.checkpoint.load import read_any_checkpoint
from dalle_dist.checkpoint.tools import (
    check_output,
    choose_weights,
    verify_payload,
    weight_parts,
)
from dalle_dist.errors import CheckpointError
from dalle_dist.fileio import atomic_path

EXPORT_FORMAT = "dalle_dist.export"
EXPORT_FORMAT_VERSION = 1
#: Key prefixes inside an exported .safetensors file, one per model.
PREFIXES = {"dalle": "dalle.", "vae": "vae."}


# -- export -----------------------------------------------------------------------------


def export_paths(out: str | Path) -> tuple[Path, Path]:
    """OUT (with or without .safetensors / .json) -> (OUT.safetensors, OUT.json)."""
    out = Path(out)
    if out.suffix in (".safetensors", ".json"):
        out = out.with_suffix("")
    return out.with_name(out.name + ".safetensors"), out.with_name(out.name + ".json")


def _unshared(state: dict[str, torch.Tensor], prefix: str,
              seen: set[int]) -> dict[str, torch.Tensor]:
    """Prefixed, contiguous tensors; safetensors refuses tensors that share memory."""
    out = {}
    for key, tensor in state.items():
        tensor = tensor.detach().contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[prefix + key] = tensor
    return out


def export_checkpoint(path: str | Path, out: str | Path, force: bool = False,
                      flag: str = "PATH", weights: str = "auto") -> tuple[Path, Path]:
    """Write OUT.safetensors (weights, keys prefixed `dalle.` / `vae.`) and OUT.json
    (configs and provenance) from a checkpoint of either kind; returns both paths.
    weights: auto, ema or trained (checkpoint.tools.choose_weights); the JSON says which."""
    from safetensors.torch import save_file

    path = Path(path)
    weights_path, json_path = export_paths(out)
    for target in (weights_path, json_path):
        check_output(target, "OUT", force)
    payload = read_any_checkpoint(path, flag, with_optimizer=False)
    verify_payload(payload, flag, path)  # an export that cannot be loaded is no export
    payload, chosen = choose_weights(payload, weights, f"{flag} {path}")
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, _, weights in weight_parts(payload, flag, path):
        tensors.update(_unshared(weights, PREFIXES[name], seen))
    configs = payload["configs"]
    keep = ("model", "vae", "tokenizer") if payload["kind"] == "dalle" else ("model",)
    description = {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "kind": payload["kind"],
        "weights_file": weights_path.name,
        "prefixes": {name: PREFIXES[name] for name, _, _ in weight_parts(payload, flag, path)},
        "configs": {key: configs[key] for key in keep if key in configs},
        "weights": chosen,
        "step": payload.get("step"),
        "epoch": payload.get("epoch"),
        "package_version": payload.get("package_version"),
        "exported_by": __version__,
        "source": str(path),
    }
    with atomic_path(weights_path) as weights_tmp, atomic_path(json_path) as json_tmp:
        save_file(tensors, str(weights_tmp),
                  metadata={"format": "pt", "dalle_dist_kind": payload["kind"]})
        json_tmp.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    return weights_path, json_path


def load_exported(path: str | Path, flag: str = "PATH") -> dict[str, Any]:
    """An export (its .json or its .safetensors) as a checkpoint-like payload: kind,
    configs, step, weights and, for DALL-E, vae_weights; `dalle_parts` and
    `vae_from_checkpoint` accept it. Reads safetensors only: nothing is unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights_path, json_path = export_paths(path)
    if not json_path.is_file():
        raise CheckpointError(f"{flag} {path}: {json_path} does not exist",
                              "an export is a .json beside its .safetensors; keep them together")
    try:
        description = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{flag} {json_path} is not readable JSON ({exc})",
                              "export the checkpoint again") from None
    if not isinstance(description, dict) or description.get("format") != EXPORT_FORMAT:
        raise CheckpointError(f"{flag} {json_path} is not a dalle_dist export",
                              "write one with dalle-dist checkpoint export")
    if description.get("format_version", 0) > EXPORT_FORMAT_VERSION:
        raise CheckpointError(f"{flag} {json_path} has export format "
                              f"{description['format_version']}, newer than this dalle_dist "
                              f"reads ({EXPORT_FORMAT_VERSION})", "upgrade dalle_dist")
    kind, configs = description.get("kind"), description.get("configs")
    if kind not in PREFIXES or not isinstance(configs, dict):
        raise CheckpointError(f"{flag} {json_path} has no valid kind and configs",
                              "export the checkpoint again")
    weights_path = json_path.with_name(description.get("weights_file", weights_path.name))
    if not weights_path.is_file():
        raise CheckpointError(f"{flag} {path}: {weights_path} does not exist",
                              "an export is a .json beside its .safetensors; keep them together")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{flag} {weights_path} is not a readable safetensors file "
                              f"({str(exc).splitlines()[0] if str(exc) else 'corrupt'})",
                              "export the checkpoint again") from None
    split = {name: {k.removeprefix(prefix): v for k, v in tensors.items()
                    if k.startswith(prefix)}
             for name, prefix in description.get("prefixes", PREFIXES).items()}
    payload: dict[str, Any] = {
        "format_version": description.get("format_version"),
        "kind": kind,
        "package_version": description.get("package_version"),
        "configs": configs,
        "step": description.get("step"),
        "epoch": description.get("epoch"),
        "optimizer": None,
    }
    if kind == "dalle":
        payload.update(weights=split.get("dalle", {}), vae_weights=split.get("vae", {}))
    else:
        payload["weights"] = split.get("vae", {})
    return payload
