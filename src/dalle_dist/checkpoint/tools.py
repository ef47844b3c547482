"""`dalle-dist checkpoint`: inspect, convert and verify checkpoints of every kind.

- inspect: metadata, configs, sizes and parameter counts without reading any weight (a
  single file is memory-mapped and only tensor shapes and dtypes are looked at; a sharded
  directory is described from its meta.pt and DCP's metadata; a DeepSpeed directory from
  its auxiliary.pt and file sizes; parameter counts come from the model rebuilt on the
  `meta` device).
- convert: a DeepSpeed directory of any ZeRO stage, or a sharded directory -> one
  single-file checkpoint (fp32; a sharded one keeps its optimizer state), and a single
  file -> a sharded directory.
- verify: every weight's name and shape against the model its config describes, and
  every value finite.
- export: see checkpoint/export.py.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dalle_dist.backends.ema import shared_names, with_ema
from dalle_dist.checkpoint.deepspeed_dir import (
    AUXILIARY_FILE,
    UNIVERSAL_SUFFIX,
    consolidated_weights,
    group_parameter_names,
    is_ds_checkpoint_dir,
    latest_tag,
    make_universal,
    read_ds_meta,
    tag_ema,
    tag_order,
    universal_optimizer,
)
from dalle_dist.checkpoint.format import read_checkpoint_file, write_checkpoint_file
from dalle_dist.checkpoint.load import read_any_checkpoint
from dalle_dist.checkpoint.sharded_dir import (
    META_FILE,
    is_sharded_dir,
    latest_save,
    read_sharded_whole,
    save_order,
    write_sharded,
)
from dalle_dist.errors import CheckpointError, ConfigError, OutputError
from dalle_dist.fileio import ensure_writable_file
from dalle_dist.model import DALLE, DALLEConfig, image_tokenizer_from_dict

#: How many names an error lists before "(+N more)": the message stays one line.
LISTED = 4


# -- shared helpers ---------------------------------------------------------------------


def weight_parts(payload: dict[str, Any], flag: str, path: Path
                 ) -> list[tuple[str, dict[str, Any], Any]]:
    """(model name, its config dict, its weights or None) for every model a payload holds:
    a VAE checkpoint holds one, a DALL-E checkpoint its transformer and its VAE."""
    configs = payload.get("configs") or {}
    kind = payload.get("kind")
    if kind == "vae":
        keys = [("vae", "model", "weights")]
    elif kind == "dalle":
        keys = [("dalle", "model", "weights"), ("vae", "vae", "vae_weights")]
    else:
        raise CheckpointError(f"{flag} {path} has unknown checkpoint kind {kind!r}",
                              "give a checkpoint written by dalle-dist")
    parts = []
    for name, config_key, weights_key in keys:
        if not isinstance(configs.get(config_key), dict):
            raise CheckpointError(f"{flag} {path} has no {config_key!r} config",
                                  "the file is damaged or was not written by dalle-dist")
        parts.append((name, configs[config_key], payload.get(weights_key)))
    return parts


def meta_model(name: str, config: dict[str, Any], flag: str, path: Path) -> nn.Module:
    """The model a config describes, built on the `meta` device: shapes, no memory."""
    try:
        with torch.device("meta"):
            if name == "dalle":
                return DALLE(DALLEConfig.from_dict(config))
            return image_tokenizer_from_dict(config)  # a DiscreteVAE or a VQGAN
    except (TypeError, ValueError, ConfigError) as exc:
        raise CheckpointError(f"{flag} {path} has a {name} config that does not build a "
                              f"model ({str(exc).splitlines()[0]})",
                              "the file is damaged or from another version") from None


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def tensor_summary(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Counts from shapes and dtypes only (nothing of a memory-mapped tensor is paged in)."""
    return shape_summary({k: (v.shape, v.dtype) for k, v in state.items()
                          if isinstance(v, torch.Tensor)})


def shape_summary(shapes: dict[str, tuple[torch.Size, torch.dtype]]) -> dict[str, Any]:
    """tensor_summary's counts from (shape, dtype) pairs: a sharded save's metadata."""
    dtypes: dict[str, int] = {}
    elements = nbytes = 0
    for shape, dtype in shapes.values():
        count = shape.numel()
        name = str(dtype).removeprefix("torch.")
        dtypes[name] = dtypes.get(name, 0) + count
        elements += count
        nbytes += count * dtype.itemsize
    return {"tensors": len(shapes), "elements": elements, "bytes": nbytes, "dtypes": dtypes}


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" (+{len(names) - LISTED} more)" if len(names) > LISTED else "")


def check_output(path: Path, flag: str, force: bool) -> None:
    """Refuse to replace an existing file without --force, or to write where we cannot."""
    if path.exists() and not path.is_dir() and not force:
        raise OutputError(f"{flag} {path} already exists",
                          "pass --force to replace it, or choose another name")
    ensure_writable_file(path, flag)


# -- inspect ----------------------------------------------------------------------------


def inspect_checkpoint(path: str | Path, flag: str = "PATH") -> dict[str, Any]:
    """What a checkpoint holds, as one JSON-ready dict (docs/checkpoints.md, "inspect", lists
    the keys). Reads metadata only: weights are never loaded."""
    path = Path(path)
    if is_sharded_dir(path):
        return _inspect_sharded(path, flag)
    is_ds = is_ds_checkpoint_dir(path)
    if is_ds:
        tag = latest_tag(path, flag)
        aux = path / tag / AUXILIARY_FILE
        # read_ds_meta raises the one-line error for a tag without our metadata.
        meta = (read_checkpoint_file(aux, flag) if aux.is_file()
                else read_ds_meta(path, flag))
        tags = sorted((p.name for p in path.iterdir() if p.is_dir() and tag_order(p.name)),
                      key=lambda name: tag_order(name) or (0, 0))
        tag_sizes = {name: tree_size(path / name) for name in tags}
        optimizer = True  # DeepSpeed keeps it in the tag (optim_states or model_states)
    else:
        meta = read_checkpoint_file(path, flag)
        tag, tags, tag_sizes = None, [], {}
        optimizer = meta.get("optimizer") is not None
    # A DeepSpeed directory's module weights stay in DeepSpeed's files, unread.
    return _info(path, "deepspeed" if is_ds else "file", meta, flag, tag, tags, tag_sizes,
                 optimizer, lambda: None)


def _info(path: Path, layout: str, meta: dict[str, Any], flag: str, tag: str | None,
          tags: list[str], tag_sizes: dict[str, int], optimizer: bool,
          unsaved_weights: Any) -> dict[str, Any]:
    """inspect_checkpoint's dict; unsaved_weights(): the summary of a model whose weights
    are not in `meta` (a directory's)."""
    parameters, weights = {}, {}
    for name, config, state in weight_parts(meta, flag, path):
        parameters[name] = parameter_count(meta_model(name, config, flag, path))
        weights[name] = tensor_summary(state) if isinstance(state, dict) else unsaved_weights()
    configs = meta["configs"]
    return {
        "path": str(path),
        "format": layout,
        "zero_stage": meta.get("zero_stage"),
        "tag": tag,
        "tags": tags,
        "kind": meta["kind"],
        "step": meta.get("step"),
        "epoch": meta.get("epoch"),
        "batch": meta.get("batch"),
        "backend": meta.get("backend"),
        "world_size": meta.get("world_size"),
        "package_version": meta.get("package_version"),
        "format_version": meta.get("format_version"),
        "configs": {"model": configs.get("model"), "vae": configs.get("vae")},
        "parameters": parameters,
        "weights": weights,
        "optimizer": optimizer,
        "scheduler": meta.get("scheduler") is not None,
        "converted_from": meta.get("converted_from"),
        "size_bytes": tree_size(path),
        "tag_sizes": tag_sizes,
    }


def _inspect_sharded(path: Path, flag: str) -> dict[str, Any]:
    """inspect_checkpoint for a sharded directory: our meta.pt, and the transformer's
    shapes from DCP's metadata (no shard is read)."""
    from dalle_dist.checkpoint.dcp_io import read_metadata, tensor_shapes

    folder = latest_save(path, flag)
    meta = read_checkpoint_file(folder / META_FILE, flag)
    metadata = read_metadata(folder)
    saves = sorted((p.name for p in path.iterdir() if p.is_dir() and save_order(p.name)),
                   key=lambda name: save_order(name) or (0, 0))
    optimizer = any(key.startswith("optim.") for key in metadata.state_dict_metadata)
    return _info(path, "sharded", meta, flag, folder.name, saves,
                 {name: tree_size(path / name) for name in saves}, optimizer,
                 lambda: shape_summary(tensor_shapes(metadata, "model.")))


def _config_line(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    return ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in config.items())


def _weights_line(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "in DeepSpeed's files (fp32 once converted)"
    dtypes = ", ".join(f"{name} {count:,}" for name, count in summary["dtypes"].items())
    return f"{summary['tensors']} tensors, {summary['elements']:,} values ({dtypes or '-'})"


def describe(info: dict[str, Any]) -> list[str]:
    """inspect_checkpoint's dict as aligned `label  value` lines for a person."""
    if info["format"] == "deepspeed":
        layout = (f"DeepSpeed directory, ZeRO-{info['zero_stage']}, tag {info['tag']} "
                  f"(tags: {', '.join(info['tags'])})")
    elif info["format"] == "sharded":
        layout = (f"sharded directory (torch.distributed.checkpoint), save {info['tag']} "
                  f"(saves: {', '.join(info['tags'])})")
    else:
        layout = "single file"
        if info["zero_stage"] is not None:
            layout += f" (from a DeepSpeed ZeRO-{info['zero_stage']} run)"
    source = info["converted_from"]
    rows = [
        ("path", info["path"]),
        ("format", layout),
        ("kind", info["kind"]),
        ("step", f"{info['step']} (epoch {info['epoch']}, batch {info['batch']})"),
        ("backend", f"{info['backend']}, world size {info['world_size']}"),
        ("written by", f"dalle_dist {info['package_version']}, checkpoint format "
                       f"{info['format_version']}"),
        *([("converted from", f"{source.get('ds_dir') or source.get('path')} "
                               f"{source.get('tag') or ''}".rstrip())] if source else []),
        ("model config", _config_line(info["configs"]["model"])),
        *([("vae config", _config_line(info["configs"]["vae"]))]
          if info["configs"]["vae"] else []),
        *((f"{name} parameters", f"{count:,}") for name, count in info["parameters"].items()),
        *((f"{name} weights", _weights_line(summary))
          for name, summary in info["weights"].items()),
        ("optimizer state", "yes" if info["optimizer"] else "no"),
        ("size", f"{info['size_bytes']:,} bytes"),
        *((f"  {tag}", f"{size:,} bytes") for tag, size in info["tag_sizes"].items()),
    ]
    width = max(len(label) for label, _ in rows)
    return [f"{label:<{width}}  {value}" for label, value in rows]


# -- convert ----------------------------------------------------------------------------


#: What `convert` writes: one file, or a sharded directory.
TO_FILE, TO_SHARDED = "file", "sharded"


def _not_convertible(path: Path) -> CheckpointError:
    """The one-line error for a SOURCE that is no checkpoint, saying what it is."""
    fix = ("give a NAME-ds-cp/ or NAME-sharded/ folder a run wrote, or a single-file "
           "checkpoint")
    if not path.exists():
        return CheckpointError(f"SOURCE {path} does not exist", "check the path")
    return CheckpointError(f"SOURCE {path} is a folder with no 'latest' file and no "
                           "global_stepN or step-N save, not a checkpoint directory", fix)


def convert_checkpoint(source: str | Path, out: str | Path, force: bool = False,
                       to: str | None = None) -> dict[str, Any]:
    """Turn one kind of checkpoint into another; returns what was written.

    - the newest tag of a DeepSpeed directory (any ZeRO stage) -> one file (fp32 weights,
      no optimizer state: zero_to_fp32 gathers the weights only);
    - the newest save of a sharded directory -> one file, optimizer state included;
    - a single file -> a sharded directory `out` (one save, as if one rank wrote it; DCP
      reshards it to any number of ranks at the resume).
    to: "file" or "sharded"; None: a file becomes sharded, a directory a file.
    """
    source, out = Path(source), Path(out)
    is_file = source.is_file()
    if not (is_file or is_ds_checkpoint_dir(source) or is_sharded_dir(source)):
        raise _not_convertible(source)
    to = to or (TO_SHARDED if is_file else TO_FILE)
    if is_file and to == TO_FILE:
        kind = read_checkpoint_file(source, "SOURCE")["kind"]
        raise CheckpointError(f"SOURCE {source} is already a single-file {kind} checkpoint",
                              "nothing to convert: use it as it is, or --to sharded")
    # The output is checked before anything is read: consolidating can take minutes.
    if to == TO_SHARDED:
        check_output_dir(out, force)
    else:
        check_output(out, "OUT", force)
    if is_file:
        payload = {**read_checkpoint_file(source, "SOURCE"),
                   "converted_from": {"path": str(source)}}
    elif is_sharded_dir(source):
        payload = {**read_sharded_whole(source, "SOURCE"),
                   "converted_from": {"path": str(source),
                                      "tag": latest_save(source, "SOURCE").name}}
    else:
        payload = _from_ds_dir(source)
    if to == TO_SHARDED:
        written = write_sharded(out, payload)
        size, out_text = tree_size(out), f"{out} (save {written})"
    else:
        write_checkpoint_file(out, payload)
        size, out_text = out.stat().st_size, str(out)
    tensors = len(payload["weights"])
    converted = payload.get("converted_from") or {}
    return {"out": out_text, "to": to, "tag": converted.get("tag"), "step": payload.get("step"),
            "zero_stage": payload.get("zero_stage"), "kind": payload["kind"],
            "parameters": sum(t.numel() for t in payload["weights"].values()),
            "tensors": tensors, "size_bytes": size,
            "optimizer": payload.get("optimizer") is not None}


def _from_ds_dir(ds_dir: Path) -> dict[str, Any]:
    """A DeepSpeed directory's newest tag as a single file's payload: fp32 weights
    (zero_to_fp32) and, from ZeRO partitions, Adam's state by parameter name (through the
    tag's universal checkpoint: the one a resume at another world size made, or one made
    for this in a temporary folder beside the directory)."""
    # keep_ds_dir: the metadata names the tag it describes; its weights come from that tag.
    meta = read_any_checkpoint(ds_dir, "SOURCE", keep_ds_dir=True)
    tag = meta["ds_tag"]
    weights = consolidated_weights(ds_dir, tag, "SOURCE")
    rest = {k: v for k, v in meta.items() if k not in ("ds_dir", "ds_tag")}
    rest.update(tag_ema(ds_dir, tag, weights))
    optimizer = None
    if meta.get("zero_stage") and meta["kind"] == "dalle":
        names = [name for name, _ in meta_model("dalle", meta["configs"]["model"], "SOURCE",
                                                ds_dir).named_parameters()]
        shapes = {name: weights[name].shape for name in names}
        groups = group_parameter_names(ds_dir / tag)
        universal = ds_dir / f"{tag}{UNIVERSAL_SUFFIX}"
        if (universal / "zero" / "optimizer_state.pt").is_file():
            optimizer = universal_optimizer(universal, shapes, "SOURCE", groups)
        else:
            with tempfile.TemporaryDirectory(dir=ds_dir.parent,
                                             prefix=f".{ds_dir.name}.") as scratch:
                made = Path(scratch) / f"{tag}{UNIVERSAL_SUFFIX}"
                make_universal(ds_dir / tag, made, "SOURCE")
                optimizer = universal_optimizer(made, shapes, "SOURCE", groups)
    return {**rest, "weights": weights, "optimizer": optimizer,
            "converted_from": {"ds_dir": str(ds_dir), "tag": tag,
                               "zero_stage": meta.get("zero_stage")}}


def check_output_dir(path: Path, force: bool) -> None:
    """A sharded OUT is a new folder, or (with --force) a sharded directory to replace."""
    if path.exists():
        if not force:
            raise OutputError(f"OUT {path} already exists",
                              "pass --force to replace it, or choose another name")
        if not is_sharded_dir(path):
            raise OutputError(f"OUT {path} exists and is not a sharded checkpoint "
                              "directory: not replaced, even with --force",
                              "choose another name")
        shutil.rmtree(path)
    ensure_writable_file(path / "latest", "OUT")


# -- verify -----------------------------------------------------------------------------


def check_weights(name: str, weights: Any, model: nn.Module, flag: str, path: Path) -> int:
    """Names and shapes equal to the model's state_dict, every value finite, the names of a
    shared module equal; returns the number of values (a shared one once). Raises a
    one-line CheckpointError naming what differs."""
    if not isinstance(weights, dict):
        raise CheckpointError(f"{flag} {path} has no {name} weights",
                              "the file is damaged; use another checkpoint")
    expected = model.state_dict()
    not_tensors = [k for k, v in weights.items() if not isinstance(v, torch.Tensor)]
    weights = {k: v for k, v in weights.items() if k not in not_tensors}
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    wrong = [f"{k} {list(weights[k].shape)} (config gives {list(v.shape)})"
             for k, v in expected.items()
             if k in weights and tuple(weights[k].shape) != tuple(v.shape)]
    problems = [f"{label} {_listed(names)}" for label, names in
                (("not a tensor", not_tensors), ("missing", missing),
                 ("unexpected", unexpected), ("wrong shape", wrong))
                if names]
    if problems:
        raise CheckpointError(f"{flag} {path}: {name} weights do not match its config: "
                              + "; ".join(problems),
                              "the file was altered or belongs to another model; "
                              "use another checkpoint")
    for key, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{flag} {path}: {name} weight {key} holds NaN or inf",
                                  "training diverged or the file is damaged; use an "
                                  "earlier checkpoint")
    duplicates = 0
    for names in shared_names(model):
        for other in names[1:]:
            if not torch.equal(weights[names[0]], weights[other]):
                raise CheckpointError(
                    f"{flag} {path}: {name} weights {names[0]} and {other} differ, but the "
                    "model shares one module between those layers (--shared_attn_ids / "
                    "--shared_ff_ids)", "the file was altered or damaged; use another "
                    "checkpoint")
            duplicates += weights[other].numel()
    return sum(t.numel() for t in weights.values()) - duplicates


def choose_weights(payload: dict[str, Any], choice: str, where: str
                   ) -> tuple[dict[str, Any], str]:
    """`payload` with its `weights` the set `choice` names, and which set that is ("ema" or
    "trained"); the other set is left out. choice: "ema", "trained", or "auto" (the EMA
    where the checkpoint holds one: train --ema_decay). `where` names the checkpoint in
    a refusal.

    The EMA holds each parameter once (a module shared by several layers under its first
    name) and no buffers: the chosen set is the trained state dict with every parameter's
    names, aliases included, given the average."""
    ema = payload.get("ema_weights")
    if choice == "ema" and not ema:
        raise CheckpointError(f"{where} holds no EMA weights (it was trained without "
                              "--ema_decay)", "take its trained weights: --weights trained")
    rest = {k: v for k, v in payload.items() if k != "ema_weights"}
    if not ema or choice == "trained":
        return rest, "trained"
    model = meta_model(payload["kind"], payload["configs"]["model"], where, Path())
    expected = model.state_dict()
    wrong = [k for k, v in ema.items() if k not in expected or v.shape != expected[k].shape]
    if wrong:
        raise CheckpointError(f"{where}: EMA weights do not match its config ({_listed(wrong)})",
                              "the file was altered; take its trained weights: --weights "
                              "trained (generate: --no_ema)")
    return {**rest, "weights": with_ema(model, payload["weights"], ema)}, "ema"


def verify_payload(payload: dict[str, Any], flag: str, path: Path) -> dict[str, int]:
    """check_weights for every model of the payload; values per model."""
    return {name: check_weights(name, weights, meta_model(name, config, flag, path), flag,
                                path)
            for name, config, weights in weight_parts(payload, flag, path)}


def verify_checkpoint(path: str | Path, flag: str = "PATH") -> str:
    """Load a checkpoint of either kind and check it against its configs; the `ok: ...`
    summary, or a one-line CheckpointError."""
    path = Path(path)
    payload = read_any_checkpoint(path, flag)
    counts = verify_payload(payload, flag, path)
    models = " + ".join(f"{name} {count:,}" for name, count in counts.items())
    return (f"ok: {payload['kind']} checkpoint {path}, step {payload.get('step')}: "
            f"{models} values; names and shapes match the configs, all finite")
