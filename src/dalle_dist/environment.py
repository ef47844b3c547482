"""What this machine can run: facts about torch, devices and engines, and verdicts.

`dalle-dist check` prints all of it; `train` and `train-vae` ask the same verdict
functions for their backend and precision before anything else, so a doomed launch stops
in seconds with the text `check` would print. Probing only imports and asks: it never
launches training, never builds an op (DeepSpeed's ops are asked whether they *could*
build, as ds_report does) and never installs anything. No probe raises: a broken engine
is a fact to report.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

SHM_WARN_BYTES = 1 << 30
DEEPSPEED_FIX = "pip install 'dalle_dist[deepspeed]'"
HOROVOD_FIX = ("build it with scripts/build_horovod.sh (Horovod 0.28.1 needs a C++17 patch "
               "against current torch), then pip install 'dalle_dist[horovod]'")


@dataclass(frozen=True)
class Verdict:
    usable: bool
    reason: str = ""
    fix: str = ""

    def text(self) -> str:
        if self.usable:
            return "usable" + (f" ({self.reason})" if self.reason else "")
        return f"not usable: {self.reason}" + (f" (fix: {self.fix})" if self.fix else "")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


# -- facts -------------------------------------------------------------------------------

def torch_facts() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

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


@contextlib.contextmanager
def _quiet() -> Any:
    from dalle_dist.fileio import quiet_output

    with quiet_output():
        yield


def deepspeed_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"installed": importlib.util.find_spec("deepspeed") is not None,
                             "version": _version("deepspeed"), "importable": False,
                             "error": None, "accelerator": None, "ops": {},
                             "sparse_attention": None}
    if not facts["installed"]:
        return facts
    try:
        with _quiet():
            import deepspeed  # noqa: F401
            from deepspeed.accelerator import get_accelerator
            from deepspeed.git_version_info import installed_ops
            from deepspeed.ops.op_builder.all_ops import ALL_OPS
            from deepspeed.ops.op_builder.builder import probe_is_compatible

            facts["accelerator"] = get_accelerator()._name
            facts["ops"] = {name: {"prebuilt": bool(installed_ops.get(name, False)),
                                   "compatible": bool(probe_is_compatible(builder, False))}
                            for name, builder in sorted(ALL_OPS.items())}
    except Exception as exc:  # a broken install raises anything
        facts["error"] = _error(exc)
        return facts
    facts["importable"] = True
    has_sparse = "sparse_attn" in facts["ops"]
    facts["sparse_attention"] = (
        "present (not used: dalle_dist's sparse pattern runs on SDPA)" if has_sparse else
        f"absent: DeepSpeed {facts['version']} ships no sparse attention op (removed in "
        "0.19.7); --attn_types sparse runs on torch SDPA with the same block layout")
    return facts


def horovod_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"installed": importlib.util.find_spec("horovod") is not None,
                             "version": _version("horovod"), "torch_built": False,
                             "error": None, "controllers": {}, "tensor_operations": {}}
    if not facts["installed"]:
        return facts
    try:
        import horovod.torch as hvd
    except Exception as exc:
        facts["error"] = _error(exc)
        return facts
    facts["torch_built"] = True
    facts["controllers"] = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}
    facts["tensor_operations"] = {name: bool(getattr(hvd, f"{name}_built")())
                                  for name in ("nccl", "gloo", "mpi", "ddl", "ccl")}
    facts["cuda_built"] = bool(hvd.cuda_built())
    return facts


def apex_facts() -> dict[str, Any]:
    """absent | unrelated (the PyPI package named apex) | nvidia-without-amp | nvidia-with-amp."""
    facts: dict[str, Any] = {"state": "absent", "version": _version("apex"), "summary": None,
                             "extensions": {}, "error": None}
    if importlib.util.find_spec("apex") is None:
        return facts
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        facts["summary"] = importlib.metadata.metadata("apex")["Summary"]
    try:
        import apex
    except Exception as exc:
        facts["error"] = _error(exc)
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
    import torch

    flex = _has_module("torch.nn.attention.flex_attention")
    facts: dict[str, Any] = {
        "triton": _version("triton"),
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
    return facts


# -- verdicts ----------------------------------------------------------------------------

BACKEND_NAMES = ("single", "torch", "fsdp", "deepspeed", "horovod")


def backend_verdict(name: str, cuda: bool | None = None) -> Verdict:
    """Can this backend start here? Cheap: only the engine's own import and torch's flags."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() if cuda is None else cuda
    if name == "single":
        return Verdict(True)
    wire = "nccl" if cuda else "gloo"
    compiled = dist.is_available() and (dist.is_nccl_available() if cuda else
                                        dist.is_gloo_available())
    if name in ("torch", "fsdp", "deepspeed") and not compiled:
        return Verdict(False, f"this torch has no {wire} process group", "install a torch "
                       f"build with {wire} (the PyPI wheels have it)")
    if name == "deepspeed":
        try:
            with _quiet():
                import deepspeed  # noqa: F401
        except Exception as exc:
            return Verdict(False, f"DeepSpeed is not importable ({_error(exc)})", DEEPSPEED_FIX)
    if name == "horovod":
        try:
            import horovod.torch as hvd
        except Exception as exc:
            return Verdict(False, f"Horovod's torch support is not importable ({_error(exc)})",
                           HOROVOD_FIX)
        if not (hvd.gloo_built() or hvd.mpi_built()):
            return Verdict(False, "Horovod was built without Gloo and without MPI",
                           "rebuild it with scripts/build_horovod.sh (HOROVOD_WITH_GLOO=1)")
        if cuda and not hvd.nccl_built():
            return Verdict(True, "without NCCL: GPU tensors go through host memory")
    return Verdict(True)


def precision_verdict(backend: str, precision: str, cuda: bool | None = None) -> Verdict:
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    if precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        return Verdict(False, "this GPU has no bf16 (compute capability below 8.0)",
                       "use --precision fp16 (or fp32)")
    if precision == "fp16" and not cuda:
        if backend == "deepspeed":
            return Verdict(False, "DeepSpeed cannot train fp16 on CPU", "use --precision bf16")
        return Verdict(True, "torch.autocast fp16 on CPU is slow; bf16 is the CPU choice")
    return Verdict(True)


def report(backend: str | None = None, precision: str | None = None) -> dict[str, Any]:
    """Every fact and every verdict, as plain data (the --json schema, README "check")."""
    torch_info = torch_facts()
    cuda = torch_info["cuda_available"]
    backends = {name: asdict(backend_verdict(name, cuda)) for name in BACKEND_NAMES}
    precisions = {name: {p: asdict(precision_verdict(name, p, cuda))
                         for p in ("fp32", "bf16", "fp16")} for name in BACKEND_NAMES}
    chosen_backend, chosen_precision = backend or "single", precision or "fp32"
    requested = (backends[chosen_backend]["usable"]
                 and precisions[chosen_backend][chosen_precision]["usable"])
    return {
        "python": platform.python_version(),
        "torch": torch_info,
        "shm": shm_facts(),
        "engines": {"deepspeed": deepspeed_facts(), "horovod": horovod_facts(),
                    "apex": apex_facts()},
        "attention": attention_facts(cuda),
        "backends": backends,
        "precisions": precisions,
        "requested": {"backend": chosen_backend, "precision": chosen_precision,
                      "usable": requested},
    }
