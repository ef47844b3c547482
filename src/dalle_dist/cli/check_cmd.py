"""`dalle-dist check`: what this machine can run, and what to change when it cannot.

Exit status: 0 when the requested backend (default single) is usable at the requested
precision (default fp32), 1 when it is not, 2 on bad arguments. Nothing is launched,
built or installed (see dalle_dist.check.environment).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dalle_dist.backends.catalog import BACKEND_NAMES
from dalle_dist.backends.precision_kinds import PRECISIONS
from dalle_dist.config_base import JsonOutput, add_flags


def add_check(p: argparse.ArgumentParser) -> None:
    p.description = ("Report python, torch and its CUDA/ROCm build, devices, "
                     "process-group backends, /dev/shm, DeepSpeed, Horovod, "
                     "Apex, Triton, attention kernels and torch.compile's build tools, "
                     "then a verdict per backend and precision. Launches and builds "
                     "nothing.")
    p.add_argument("--backend", choices=BACKEND_NAMES, default=None,
                   help="the backend to judge for the exit status (default single)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="the precision to judge with it (default fp32)")
    add_flags(p, JsonOutput,
              help={"json": "print one JSON object instead of text (its schema: "
                            "docs/diagnose.md)"})
    p.add_argument("--cuda-smoke", "--cuda_smoke", dest="cuda_smoke", action="store_true",
                   help="allocate and multiply one small tensor on each GPU")
    p.set_defaults(run=run_check)


def cuda_smoke() -> dict[str, Any]:
    """Proves only that torch reaches the device, not that training will work."""
    import torch

    note = "this proves only that torch sees the device, not that training works"
    if not torch.cuda.is_available():
        return {"ran": False, "ok": False, "note": "no CUDA device: nothing to test"}
    try:
        for index in range(torch.cuda.device_count()):
            a = torch.ones(64, 64, device=f"cuda:{index}")
            if float((a @ a).sum()) != 64.0**3:
                return {"ran": True, "ok": False, "note": f"cuda:{index} computed a wrong "
                        f"product; {note}"}
        torch.cuda.synchronize()
    except Exception as exc:
        return {"ran": True, "ok": False, "note": f"{type(exc).__name__}: {exc}"}
    return {"ran": True, "ok": True, "note": f"a 64x64 matmul ran on every GPU; {note}"}


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _op_state(op: dict[str, bool]) -> str:
    """As ds_report: prebuilt into the wheel, or buildable just in time, or neither."""
    return "prebuilt" if op["prebuilt"] else "jit-compatible" if op["compatible"] else "no"


def lines(info: dict[str, Any]) -> list[str]:
    t, shm, engines = info["torch"], info["shm"], info["engines"]
    build = (f"CUDA {t['cuda_build']}" if t["cuda_build"] else
             f"ROCm {t['rocm_build']}" if t["rocm_build"] else "CPU only")
    out = [f"python        {info['python']}",
           f"torch         {t['version']} ({build})"]
    if t["devices"]:
        out += [f"device        cuda:{d['index']} {d['name']}, capability {d['capability']}, "
                f"{d['memory_gb']} GB" for d in t["devices"]]
    else:
        out.append("device        cpu (torch sees no GPU)")
    out.append(f"bf16 / fp16   {_yes(t['bf16'])} / {_yes(t['fp16'])}")
    job = info.get("slurm")
    out.append(f"slurm         {job['line']}" if job else "slurm         not in a Slurm job")
    groups = ", ".join(f"{k} {_yes(v)}" for k, v in t["process_groups"].items())
    out.append(f"torch.distributed  {groups}")
    size = "missing" if shm["bytes"] is None else f"{shm['bytes'] / 2**30:.1f} GB"
    out.append(f"/dev/shm      {size}" + (f"  warning: {shm['warning']}" if shm["warning"]
                                          else ""))
    ds = engines["deepspeed"]
    if not ds["installed"]:
        out.append("deepspeed     not installed")
    elif not ds["importable"]:
        out.append(f"deepspeed     {ds['version']}: does not import ({ds['error']})")
    else:
        ops = ", ".join(f"{name} {_op_state(op)}" for name, op in ds["ops"].items())
        out.append(f"deepspeed     {ds['version']}, accelerator {ds['accelerator']}; ops: {ops}")
        out.append(f"              sparse attention: {ds['sparse_attention']}")
    hv = engines["horovod"]
    if not hv["installed"]:
        out.append("horovod       not installed")
    elif not hv["torch_built"]:
        out.append(f"horovod       {hv['version']}: no torch support ({hv['error']})")
    else:
        ctl = ", ".join(k for k, v in hv["controllers"].items() if v) or "none"
        ops = ", ".join(k for k, v in hv["tensor_operations"].items() if v) or "none"
        out.append(f"horovod       {hv['version']} with PyTorch; controllers {ctl}; tensor "
                   f"operations {ops}")
    apex = engines["apex"]
    apex_text = {
        "absent": "not installed (--amp uses torch.autocast fp16)",
        "unrelated": f"the unrelated PyPI package named apex ({apex['summary'] or 'no summary'})"
                     ": --amp uses torch.autocast fp16",
        "nvidia-without-amp": "NVIDIA Apex without apex.amp (removed upstream): --amp uses "
                              "torch.autocast fp16",
        "nvidia-with-amp": "NVIDIA Apex with apex.amp: --amp uses it on CUDA",
    }[apex["state"]]
    if apex["extensions"]:
        apex_text += "; extensions " + ", ".join(f"{k} {_yes(v)}"
                                                 for k, v in apex["extensions"].items())
    out.append(f"apex          {apex_text}")
    att = info["attention"]
    out.append(f"triton        {att['triton'] or 'not installed'}")
    out.append(f"flex attention  {att['flex_attention']}")
    out.append("sdpa kernels  " + ", ".join(k for k, v in att["sdpa"].items() if v))
    if "compile" in info:
        from dalle_dist.check.environment import compile_line

        out.append(compile_line(info["compile"]))
    if "kernels" in att:
        from dalle_dist.check.environment import kernel_lines

        out += kernel_lines(att["kernels"])
    out.append("")
    out.append("verdicts (backend: fp32 / bf16 / fp16)")
    for name, verdict in info["backends"].items():
        if not verdict["usable"]:
            out.append(f"  {name:<10} not usable: {verdict['reason']} (fix: {verdict['fix']})")
            continue
        per = info["precisions"][name]
        marks = " / ".join("ok" if per[p]["usable"] else "no" for p in PRECISIONS)
        note = "; ".join(f"{p}: {per[p]['reason']}" + (f" (fix: {per[p]['fix']})"
                                                       if per[p]["fix"] else "")
                         for p in PRECISIONS if per[p]["reason"])
        extra = f" ({verdict['reason']})" if verdict["reason"] else ""
        out.append(f"  {name:<10} usable{extra}: {marks}" + (f"; {note}" if note else ""))
    req = info["requested"]
    out.append(f"requested: {req['backend']} {req['precision']}: "
               f"{'usable' if req['usable'] else 'NOT usable'}")
    if "cuda_smoke" in info:
        out.append(f"cuda smoke: {'ok' if info['cuda_smoke']['ok'] else 'failed'}: "
                   f"{info['cuda_smoke']['note']}")
    return out


def run_check(args: argparse.Namespace) -> int:
    from dalle_dist.check.environment import report

    info = report(args.backend, args.precision)
    if args.cuda_smoke:
        info["cuda_smoke"] = cuda_smoke()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print("\n".join(lines(info)))
    return 0 if info["requested"]["usable"] else 1
