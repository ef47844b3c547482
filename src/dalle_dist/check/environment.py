"""What this machine can run: facts about torch, devices and engines, and verdicts.

`dalle-dist check` prints all of it. The verdicts are the backends' and precisions' own
(backends/registry.py), the ones `train` and `train-vae` ask before anything else, so a
doomed launch stops in seconds with the text `check` would print; each backend with an
engine beyond torch also reports that engine's facts. Probing only imports and asks: it
never launches training, never builds an op (DeepSpeed's ops are asked whether they
*could* build, as ds_report does) and never installs anything. No probe raises: a broken
engine is a fact to report.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.distributed as dist

from dalle_dist.backends import slurm
from dalle_dist.backends.precision_kinds import DEFAULT_PRECISION, PRECISIONS
from dalle_dist.backends.registry import (
    BACKENDS,
    DEFAULT_BACKEND,
    backend_verdict,
    precision_verdict,
)
from dalle_dist.backends.verdict import error_line, installed_version
from dalle_dist.model.config import DALLEConfig, VAEConfig
from dalle_dist.model.kernels import by_precision, cuda_capability
from dalle_dist.model.patterns import PATTERNS
from dalle_dist.model.toolchain import inductor_toolchain
from dalle_dist.plan.advice import attention_kernels

SHM_WARN_BYTES = 1 << 30
#: The --attn_dropout the kernel facts name a second kernel for (any rate > 0 is alike).
EXAMPLE_DROPOUT = 0.1


# -- facts -------------------------------------------------------------------------------

def torch_facts() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    devices = []
    for index in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(index)
        devices.append({"index": index, "name": props.name,
                        "capability": f"{props.major}.{props.minor}",
                        "memory_gb": round(props.total_memory / 2**30, 1)})
    return {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "rocm_build": getattr(torch.version, "hip", None),
        "cuda_available": cuda,
        "devices": devices,
        "bf16": bool(torch.cuda.is_bf16_supported()) if cuda else True,
        "fp16": True,  # CUDA, and torch.autocast on CPU (DeepSpeed refuses it there)
        "process_groups": {"gloo": dist.is_available() and dist.is_gloo_available(),
                           "nccl": dist.is_available() and dist.is_nccl_available(),
                           "mpi": dist.is_available() and dist.is_mpi_available()},
    }


def shm_facts(path: str = "/dev/shm") -> dict[str, Any]:
    try:
        stats = os.statvfs(path)
    except OSError:
        return {"path": path, "bytes": None, "warning": f"{path} is missing"}
    size = stats.f_blocks * stats.f_frsize
    warning = (f"{path} holds {size / 2**20:.0f} MB: data loader workers and NCCL need more "
               "(in Docker: docker run --shm-size 1g)" if size < SHM_WARN_BYTES else None)
    return {"path": path, "bytes": size, "warning": warning}


def apex_facts() -> dict[str, Any]:
    """absent | unrelated (the PyPI package named apex) | nvidia-without-amp | nvidia-with-amp."""
    facts: dict[str, Any] = {"state": "absent", "version": installed_version("apex"),
                             "summary": None, "extensions": {}, "error": None}
    if importlib.util.find_spec("apex") is None:
        return facts
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        facts["summary"] = importlib.metadata.metadata("apex")["Summary"]
    try:
        import apex
    except Exception as exc:
        facts["error"] = error_line(exc)
        apex = None
    nvidia = "nvidia" in (facts["summary"] or "").lower() or (
        apex is not None and any(_has_module(f"apex.{sub}")
                                 for sub in ("optimizers", "normalization", "amp")))
    if not nvidia:
        facts["state"] = "unrelated"
        return facts
    facts["state"] = "nvidia-with-amp" if _has_module("apex.amp") else "nvidia-without-amp"
    facts["extensions"] = {name: _has_module(name) for name in ("apex_C", "amp_C")}
    return facts


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def attention_facts(cuda: bool) -> dict[str, Any]:
    flex = _has_module("torch.nn.attention.flex_attention")
    facts: dict[str, Any] = {
        "triton": installed_version("triton"),
        "flex_attention": ("trains on CUDA" if flex and cuda else
                           "importable; no backward on CPU, so --attn_impl flex cannot train "
                           "here" if flex else "not in this torch"),
    }
    if cuda:
        backends = torch.backends.cuda
        facts["sdpa"] = {"flash": backends.flash_sdp_enabled(),
                         "mem_efficient": backends.mem_efficient_sdp_enabled(),
                         "cudnn": backends.cudnn_sdp_enabled(), "math": backends.math_sdp_enabled()}
    else:
        facts["sdpa"] = {"cpu_flash": True, "math": True}
    facts["kernels"] = kernel_facts()
    return facts


def kernel_facts() -> dict[str, Any]:
    """The kernel a training layer of each pattern uses here (the first GPU, else the CPU),
    per precision, with --attn_impl auto at train's default sizes, without and with
    --attn_dropout (plan's attention_kernels, which `dalle-dist plan` prints for a run's
    own flags):
    {"capability": "9.0" | null, "text_seq_len", "image_fmap_size", "dim_head",
     "patterns": {pattern: {"train" | "train_with_dropout": {precision: kernel}}}}."""
    device = "cpu" if cuda_capability() is None else "cuda"
    vae = VAEConfig()
    c = DALLEConfig(num_text_tokens=2, num_image_tokens=vae.num_tokens,
                    image_fmap_size=vae.fmap_size, attn_types=tuple(PATTERNS))
    runs = {key: attention_kernels(replace(c, attn_dropout=rate), device, "auto", PRECISIONS)
            for key, rate in (("train", 0.0), ("train_with_dropout", EXAMPLE_DROPOUT))}
    patterns = {name: {key: {precision: entry["kernel"]
                             for precision, entry in run["patterns"][name].items()}
                       for key, run in runs.items()} for name in PATTERNS}
    return {"capability": runs["train"]["capability"], "text_seq_len": c.text_seq_len,
            "image_fmap_size": c.image_fmap_size, "dim_head": c.dim_head,
            "patterns": patterns}


def kernel_lines(kernels: dict[str, Any]) -> list[str]:
    """`kernel_facts` as text for `dalle-dist check`: a heading, then a line per pattern."""
    where = ("cpu" if kernels["capability"] is None
             else f"cuda:0 (compute capability {kernels['capability']})")
    lines = [f"attention kernels on {where}, --attn_impl auto, train's default sizes "
             "(`dalle-dist plan` names them for yours):"]
    width = max(len(name) for name in kernels["patterns"])
    for name, per in kernels["patterns"].items():
        lines.append(f"  {name:<{width}}  {by_precision(per['train'])}; with --attn_dropout: "
                     f"{by_precision(per['train_with_dropout'])}")
    return lines


def compile_facts(cuda: bool) -> dict[str, Any]:
    """Whether torch.compile's inductor can build kernels here (model/toolchain.py), for
    this machine's device: what `train --compile`, `generate --compile` and, on CUDA,
    FlexAttention need (Toolchain.as_dict)."""
    return inductor_toolchain("cuda" if cuda else "cpu").as_dict()


def compile_line(facts: dict[str, Any]) -> str:
    """`compile_facts` as one line of `dalle-dist check`."""
    users = ("train --compile, generate --compile and FlexAttention (--attn_impl auto's "
             "band patterns)" if facts["device"] == "cuda"
             else "train --compile and generate --compile")
    if facts["ready"]:
        tools = [facts["compiler"], "Python.h"] + ([f"triton {facts['triton']}"]
                                                  if facts["triton"] else [])
        return f"torch.compile inductor on {facts['device']}: ready ({', '.join(tools)}): {users}"
    return (f"torch.compile inductor on {facts['device']}: needs {facts['needs']} "
            f"({'; '.join(facts['missing'])}): {users} stop before they start "
            f"(fix: {facts['fix']})")


# -- verdicts ----------------------------------------------------------------------------

def report(backend: str | None = None, precision: str | None = None) -> dict[str, Any]:
    """Every fact and every verdict, as plain data (the --json schema: docs/diagnose.md).

    Backends and precisions, their verdicts and their engines' facts come from the
    registry (backends/registry.py, backends/precision.py): this module names none.
    """
    torch_info = torch_facts()
    cuda = torch_info["cuda_available"]
    backends = {name: asdict(backend_verdict(name, cuda)) for name in BACKENDS}
    precisions = {name: {p: asdict(precision_verdict(name, p, cuda)) for p in PRECISIONS}
                  for name in BACKENDS}
    chosen_backend = backend or DEFAULT_BACKEND
    chosen_precision = precision or DEFAULT_PRECISION
    requested = (backends[chosen_backend]["usable"]
                 and precisions[chosen_backend][chosen_precision]["usable"])
    engines = {name: facts for name, cls in BACKENDS.items()
               if (facts := cls.engine_facts()) is not None}
    return {
        "python": platform.python_version(),
        "torch": torch_info,
        "shm": shm_facts(),
        "engines": {**engines, "apex": apex_facts()},
        "attention": attention_facts(cuda),
        "compile": compile_facts(cuda),
        "backends": backends,
        "precisions": precisions,
        "requested": {"backend": chosen_backend, "precision": chosen_precision,
                      "usable": requested},
        "slurm": slurm_facts(),
    }


def slurm_facts() -> dict[str, Any] | None:
    """The Slurm job this runs in (backends/slurm.py); None outside one."""
    job = slurm.current_job()
    if job is None:
        return None
    return {**asdict(job), "step": slurm.in_step(), "line": job.line}
