"""DeepSpeed checkpoint directories (`<name>-ds-cp/`): layout, saving, completeness and
safe reading.

Layout (DALLE-pytorch's, docs/design.md "Checkpoints"): DeepSpeed's own tag folders
`global_stepN/`, the `latest` file naming the newest tag, and `auxiliary.pt` with our
metadata and no weights. We also put a copy of the metadata inside each tag, because the
top-level one may already describe a newer tag when a save is cut short; `latest` is
written last, so a tag it names is complete.

DeepSpeed reads its files with torch.load(weights_only=False). Before any of them is
handed to it, every file of the tag is listed with torch's pickle scanner and refused if
it names a global outside the few DeepSpeed data classes its checkpoints really hold.

The engine writes and reads its own tag folder (Engine.save_native / load_native); which
tag, the metadata, `latest` and how many tags stay are decided here.

Another world size: ZeRO partitions are per rank, so a tag is handed to DeepSpeed's own
universal checkpoint (`ds_to_universal`: one folder per parameter with its fp32 value and
Adam moments), made once beside the tag as `<tag>_universal/`, which an engine of any
world size loads (`load_universal`). The same folder gives `checkpoint convert` the
optimizer state, keyed by parameter name. No resharding here is ours.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from dalle_dist.backends import DistributedBackend, Engine
from dalle_dist.checkpoint.format import (
    mapped_privately,
    read_checkpoint_file,
    write_checkpoint_file,
)
from dalle_dist.checkpoint.sharded_dir import is_sharded_dir
from dalle_dist.checkpoint.single_file import ema_payload
from dalle_dist.errors import CheckpointError
from dalle_dist.fileio import atomic_writer, quiet_output

AUXILIARY_FILE = "auxiliary.pt"
#: the tag's sub-folder holding --ema_decay's average (DCP shards: save_ema_shards)
EMA_FOLDER = "ema"
LATEST_FILE = "latest"
UNIVERSAL_SUFFIX = "_universal"
TAG_PATTERN = re.compile(r"global_step(\d+)(?:_(\d+))?$")

#: What DeepSpeed (0.19) pickles beside tensors: ZeRO stage enum, loss scalers, bf16
#: fragment addresses. Found with torch.serialization.get_unsafe_globals_in_checkpoint on
#: checkpoints of every ZeRO stage; nothing else is accepted.
DEEPSPEED_GLOBALS = frozenset({
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
})


def ds_checkpoint_dir(path: str | Path) -> Path:
    """`dalle.pt` -> `dalle-ds-cp/` (DALLE-pytorch's name for the DeepSpeed directory)."""
    path = Path(path)
    return path.with_name(f"{path.stem}-ds-cp")


def current_tag(directory: Path) -> str | None:
    latest = directory / LATEST_FILE
    return latest.read_text(encoding="utf-8").strip() if latest.is_file() else None


def new_tag(directory: Path, step: int) -> str:
    """`global_stepN` (DeepSpeed's name), or `global_stepN_1` ... when `latest` already
    names that one (an epoch-end save right after a stop at the epoch's last step):
    a published tag is never written over."""
    tag, published, k = f"global_step{step}", current_tag(directory), 0
    while tag == published:
        k += 1
        tag = f"global_step{step}_{k}"
    return tag


def tag_order(tag: str) -> tuple[int, int] | None:
    match = TAG_PATTERN.match(tag)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def tag_step(tag: str) -> int | None:
    order = tag_order(tag)
    return order[0] if order else None


def is_ds_checkpoint_dir(path: str | Path) -> bool:
    """A folder with DeepSpeed's `latest` or a `global_stepN` tag (a sharded directory's
    `latest` names a `step-N` save instead: checkpoint/sharded_dir.py)."""
    path = Path(path)
    if not path.is_dir() or is_sharded_dir(path):
        return False
    return (path / LATEST_FILE).is_file() or any(tag_step(p.name) is not None
                                                 for p in path.iterdir())


def latest_tag(directory: Path, flag: str) -> str:
    """The tag `latest` names; it is complete because `latest` is written after it."""
    latest = directory / LATEST_FILE
    if not latest.is_file():
        raise CheckpointError(f"{flag} {directory} has no '{LATEST_FILE}' file: no save of it "
                              "finished", "use an earlier checkpoint or train from scratch")
    tag = latest.read_text(encoding="utf-8").strip()
    if not (directory / tag).is_dir():
        raise CheckpointError(f"{flag} {directory}: '{LATEST_FILE}' names {tag!r}, which is "
                              "missing", "the directory is damaged; use another checkpoint")
    return tag


def read_ds_meta(directory: str | Path, flag: str) -> dict[str, Any]:
    """Our metadata of the newest complete tag, with `ds_dir` and `ds_tag` added."""
    directory = Path(directory)
    tag = latest_tag(directory, flag)
    aux = directory / tag / AUXILIARY_FILE
    if not aux.is_file():
        raise CheckpointError(f"{flag} {directory}/{tag} has no {AUXILIARY_FILE}: it was not "
                              "written by dalle_dist", "give a directory saved by dalle-dist")
    meta = read_checkpoint_file(aux, flag)
    return {**meta, "ds_dir": str(directory), "ds_tag": tag}


def check_ds_files_safe(tag_dir: Path, flag: str) -> None:
    """Refuse, without unpickling, any file of the tag that names a foreign Python global."""
    for file in sorted(tag_dir.glob("*.pt")):
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(file)
        except Exception as exc:  # a truncated or foreign file raises anything
            raise CheckpointError(f"{flag} {file} is not a readable checkpoint "
                                  f"({type(exc).__name__})",
                                  "the file is truncated or corrupt; use an earlier tag") from None
        foreign = sorted(set(names) - DEEPSPEED_GLOBALS)
        if foreign:
            raise CheckpointError(
                f"{flag} {file} carries pickled Python objects ({', '.join(foreign[:3])}), "
                "refused unread (loading it could run arbitrary code)",
                "use a checkpoint written by dalle-dist")


def consolidated_weights(directory: str | Path, tag: str, flag: str) -> dict[str, torch.Tensor]:
    """fp32 weights of any ZeRO stage gathered into one state dict (deepspeed.utils.zero_to_fp32).

    Without optimizer partition files (fp32 without ZeRO) the whole module is in
    mp_rank_00_model_states.pt.
    """
    directory = Path(directory)
    check_ds_files_safe(directory / tag, flag)
    if not any((directory / tag).glob("*optim_states.pt")):
        states = read_ds_file(directory / tag / "mp_rank_00_model_states.pt", mmap=True)
        return {k: v.float() if v.is_floating_point() else v for k, v in states["module"].items()}
    with quiet_output():  # DeepSpeed's import warnings and progress bars
        try:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        except Exception as exc:
            raise CheckpointError(
                f"{flag} {directory} holds ZeRO partitions and DeepSpeed does not import "
                f"({type(exc).__name__})", "pip install 'dalle_dist[deepspeed]': its "
                "zero_to_fp32 gathers them") from None
        state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag)
    return {k: v.contiguous() for k, v in state.items()}


def read_ds_file(path: Path, mmap: bool = False) -> Any:
    """One file of a DeepSpeed directory, loaded with weights_only and DeepSpeed's own
    classes allowed (check_ds_files_safe has vetted the tag); `mmap`: mapped privately,
    paged in as read."""
    mapping = mapped_privately() if mmap else contextlib.nullcontext()
    with torch.serialization.safe_globals(_deepspeed_classes()), mapping:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


@functools.cache
def _deepspeed_classes() -> list[Any]:
    """The allowed DeepSpeed classes themselves, for torch.load's safe_globals; imported
    once, quietly (importing DeepSpeed prints its accelerator choice)."""
    try:
        with quiet_output():
            from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
            from deepspeed.runtime.zero.config import ZeroStageEnum
            from deepspeed.utils.tensor_fragment import fragment_address
    except Exception:
        return []
    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def write_tag_meta(directory: Path, tag: str, meta: dict[str, Any]) -> None:
    """Metadata inside the tag and at the top (DALLE-pytorch's auxiliary.pt)."""
    write_checkpoint_file(directory / tag / AUXILIARY_FILE, meta)
    write_checkpoint_file(directory / AUXILIARY_FILE, meta)


def publish_tag(directory: Path, tag: str, keep_n: int | None) -> None:
    """Make `tag` the newest: its files fsynced, `latest` replaced atomically, old tags pruned."""
    for file in (directory / tag).iterdir():
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    with atomic_writer(directory / LATEST_FILE) as f:
        f.write(tag.encode())
    if keep_n:
        tags = sorted((p for p in directory.iterdir() if p.is_dir() and tag_order(p.name)),
                      key=lambda p: tag_order(p.name) or (0, 0), reverse=True)
        for old in tags[keep_n:]:
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)
                shutil.rmtree(directory / f"{old.name}{UNIVERSAL_SUFFIX}", ignore_errors=True)


def save_ds_checkpoint(engine: Engine, path: Path, meta: dict[str, Any],
                       keep_n: int | None, single_file: bool = True) -> None:
    """DeepSpeed's own tag (all ranks), our metadata in it and beside it, the single
    weights file `path` (root) when `single_file`, and only then `latest`: a save cut
    short anywhere leaves `latest` naming the previous complete tag. keep_n: the newest N
    tags stay. single_file=False skips the whole-model gather to the root (under ZeRO-3
    every 16-bit weight) that `path` needs: periodic saves (checkpoint/checkpointer.py)."""
    import torch.distributed as dist

    directory = ds_checkpoint_dir(path)
    # The root names the tag for all: `latest` may be on rank 0's disk only, and ranks
    # that chose different tags would write two half checkpoints.
    box = [new_tag(directory, meta["step"]) if engine.is_root else None]
    dist.broadcast_object_list(box, src=0)
    tag = box[0]
    if engine.is_root and (directory / tag).exists():
        shutil.rmtree(directory / tag)  # left by a save that never finished
    dist.barrier()
    engine.save_native(directory, tag, client_state={"step": meta["step"]})
    if engine.ema is not None:
        save_ema_shards(engine, directory / tag / EMA_FOLDER)
    weights = engine.full_state_dict() if single_file else None  # collective under ZeRO-3
    ema = ema_payload(engine) if single_file else {}
    if engine.is_root:
        aux = {**meta, **engine.training_state()}
        with engine.working_alone():
            write_tag_meta(directory, tag, aux)
            if single_file:
                write_checkpoint_file(path, {**aux, "weights": weights, "optimizer": None,
                                             **ema})
    dist.barrier()  # every rank's partition files are written
    if engine.is_root:
        with engine.working_alone():
            publish_tag(directory, tag, keep_n)


def save_ema_shards(engine: Engine, folder: Path) -> None:
    """The engine's EMA into `folder` through DCP, every rank its own part (ZeRO-3: its
    partitions; replicas: written once), flat whatever the stage (backends/ema.py), so
    any world size and stage loads it back (load_ema_shards). Collective."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    save({"ema": engine.ema.sharded_state()},
         storage_writer=FileSystemWriter(str(folder), sync_files=True))


def load_ema_shards(engine: Engine, folder: Path) -> None:
    """save_ema_shards' folder into the engine's EMA, each rank reading its part."""
    from torch.distributed.checkpoint import load

    from dalle_dist.checkpoint.dcp_io import SafeLoadPlanner, SafeReader, dcp_errors

    state = {"ema": engine.ema.sharded_state()}
    with dcp_errors(f"--resume {folder} (the EMA weights) could not be loaded",
                    "resume with the model flags it was saved with"):
        load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner())
    engine.ema.load_sharded_state(state["ema"])


def tag_ema(directory: Path, tag: str, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """{"ema_weights": ...} of a tag that holds save_ema_shards' folder ({} otherwise),
    read whole in this process alone, each tensor in the shape of its parameter in
    `weights` (the tag's consolidated weights)."""
    from dalle_dist.checkpoint.dcp_io import read_whole

    folder = Path(directory) / tag / EMA_FOLDER
    if not folder.is_dir():
        return {}
    flat = read_whole(folder, {"ema"}).get("ema", {})
    return {"ema_weights": {name: value.reshape(weights[name].shape)
                            for name, value in flat.items() if name in weights}}


def make_universal(tag_dir: Path, out: Path, flag: str) -> None:
    """DeepSpeed's universal checkpoint of one tag, written to the new folder `out` (by
    rename, so it is complete or absent). ZeRO-1/2 tags lack the `universal_checkpoint_info`
    state DeepSpeed asks of the model (`inject_missing_state` adds it); the `latest_universal`
    file the converter leaves beside `out` is removed: tags are always named here."""
    check_ds_files_safe(tag_dir, flag)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_output():  # DeepSpeed's import warnings and the converter's progress
        try:
            from deepspeed.checkpoint import ds_to_universal
        except Exception as exc:
            raise CheckpointError(
                f"{flag} {tag_dir} holds ZeRO partitions and DeepSpeed does not import "
                f"({type(exc).__name__})", "pip install 'dalle_dist[deepspeed]'") from None
        ds_to_universal.main(argparse.Namespace(
            input_folder=str(tag_dir), output_folder=str(tmp), num_extract_workers=1,
            num_merge_workers=1, keep_temp_folder=False, strict=True,
            inject_missing_state=True))
    (tmp.parent / "latest_universal").unlink(missing_ok=True)
    os.replace(tmp, out)


def universal_tag(directory: Path, tag: str, flag: str) -> str:
    """`<tag>_universal` beside the tag, made on first use (make_universal); its name."""
    name = f"{tag}{UNIVERSAL_SUFFIX}"
    if not (directory / name / "zero" / "optimizer_state.pt").is_file():
        make_universal(directory / tag, directory / name, flag)
    return name


def group_parameter_names(tag_dir: Path) -> list[list[str]]:
    """The parameter names of each of the optimizer's param groups, in order, as DeepSpeed
    recorded them in the tag's model states (`param_shapes`: one name -> shape map per
    group; every rank's file holds them all). A universal checkpoint's param groups keep
    only their hyperparameters: AdamW's decayed and not-decayed groups come from here."""
    states = read_ds_file(min(tag_dir.glob("*model_states.pt")), mmap=True)
    return [list(group) for group in states["param_shapes"]]


def universal_optimizer(universal: Path, shapes: dict[str, torch.Size], flag: str,
                        groups: list[list[str]] | None = None) -> dict[str, Any]:
    """Adam's state in a universal checkpoint, keyed by parameter name as a single file
    keeps it (torch.distributed.checkpoint's form): step, exp_avg and exp_avg_sq of every
    parameter in `shapes` (name -> shape: ZeRO-3 stores each flat), and the param groups,
    each with its parameters' names from `groups` (group_parameter_names; None: one group
    of every parameter). Every file is read with weights_only (DeepSpeed's own classes
    allowed)."""
    try:
        shared = read_ds_file(universal / "zero" / "optimizer_state.pt")
        state: dict[str, dict[str, torch.Tensor]] = {}
        for name, shape in shapes.items():
            folder = universal / "zero" / name
            moments = {}
            for key in ("exp_avg", "exp_avg_sq"):
                value = read_ds_file(folder / f"{key}.pt")
                value = value["param"] if isinstance(value, dict) else value
                moments[key] = value.reshape(shape).float().contiguous()
            step = (read_ds_file(folder / "step.pt") if (folder / "step.pt").is_file()
                    else shared["optimizer_state_dict"]["state"][0]["step"])
            state[name] = {"step": torch.tensor(float(step)), **moments}
    except (OSError, KeyError, RuntimeError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{flag} {universal} is not a complete universal checkpoint "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                              "remove that folder: it is made again") from None
    members = groups if groups is not None else [list(shapes)]
    if len(members) != len(shared["param_groups"]):
        raise CheckpointError(f"{flag} {universal} has {len(shared['param_groups'])} param "
                              f"groups, its model states name {len(members)}",
                              "convert a complete DeepSpeed directory")
    param_groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": names}
                    for group, names in zip(shared["param_groups"], members, strict=True)]
    return {"state": state, "param_groups": param_groups}


def restore_group_settings(optimizer: Any, universal: Path) -> None:
    """Each param group's own hyperparameters from a universal checkpoint, after DeepSpeed
    loaded it. DeepSpeed 0.19's ZeRO-3 loader gives every group the first one's ("the
    hyperparameters of each parameter should be the same"): with AdamW's two groups, the
    norms, biases and embeddings would be decayed from the resume on."""
    saved = read_ds_file(universal / "zero" / "optimizer_state.pt")["param_groups"]
    if len(saved) != len(optimizer.param_groups):
        raise CheckpointError(f"{universal} has {len(saved)} param groups, this run's "
                              f"optimizer {len(optimizer.param_groups)}",
                              "resume with the --optimizer and --weight_decay it was "
                              "trained with")
    for group, settings in zip(optimizer.param_groups, saved, strict=True):
        group.update({k: v for k, v in settings.items() if k != "params"})


def load_ds_checkpoint(engine: Engine, payload: dict[str, Any], backend: DistributedBackend,
                       log: Any) -> None:
    """Optimizer and weights from the tag a payload read with keep_ds_dir names, through
    DeepSpeed, once every file of the tag has passed the pickle check. ZeRO partitions of
    another world size go through the tag's universal checkpoint, made by the root."""
    directory, tag = Path(payload["ds_dir"]), payload["ds_tag"]
    check_ds_files_safe(directory / tag, "--resume")
    universal = payload["world_size"] != backend.world_size and bool(payload.get("zero_stage"))
    if universal:
        stage, saved = getattr(engine, "stage", None), payload["zero_stage"]
        if stage != saved:
            raise CheckpointError(
                f"{directory} holds ZeRO-{saved} partitions of {payload['world_size']} "
                f"ranks; DeepSpeed loads them at another world size only into ZeRO-{saved}, "
                f"this run is ZeRO-{stage}",
                f"resume with --zero_stage {saved}, or convert it first: dalle-dist "
                f"checkpoint convert {directory} OUT.pt")
        tag = backend.on_root("the universal checkpoint conversion",
                              lambda: universal_tag(directory, tag, "--resume"))
        log.info(f"{directory} holds ZeRO-{saved} partitions of {payload['world_size']} "
                 f"ranks, this run has {backend.world_size}: loading them through "
                 f"DeepSpeed's universal checkpoint {directory / tag}")
    if not engine.load_native(directory, tag, universal=universal):
        raise CheckpointError(f"DeepSpeed could not load {directory}/{tag}",
                              "check the directory, or convert it to a single file")
    if universal:
        restore_group_settings(engine.optimizer, directory / tag)
