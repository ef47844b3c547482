"""One profiled training step: where a step spends its time, op by op.

`figures compile` puts this beside the eager and the compiled run's speeds. The first GPU
report found `train --compile` slower than eager (0.74x on the H200, docs/gpu.md), and a
speed alone cannot say why: the two runs' top kernels can (a different attention kernel,
a recomputation in the backward, copies the graph added around an extern kernel).
"""

from __future__ import annotations

from typing import Any

import torch

#: the ops (or CUDA kernels) a profile keeps, by their own time
TOP_OPS = 15
#: the profiler's names for a call into a dynamo-compiled frame ("Torch-Compiled Region:
#: 0/0") and for AOTAutograd's compiled backward
COMPILED_REGION, COMPILED_BACKWARD = "Torch-Compiled Region", "CompiledFunctionBackward"


def profile_step(engine: Any, inputs: tuple[Any, ...], device: torch.device,
                 top: int = TOP_OPS) -> dict[str, Any]:
    """One more forward and backward of `inputs` through `engine`, as the loop runs them
    (a compiled block runs its graph), under torch.profiler; the gradients are zeroed
    after and no optimizer step is taken, so the run's weights do not move.

    Returns the `top` entries by their own time on the device that ran them (CUDA kernels
    on a GPU, CPU ops on the CPU) as [name, milliseconds], the total of all entries, and
    how many compiled regions the step entered (dynamo's, one per compiled block call)
    and how many compiled backwards it ran: a compiled run whose step shows none ran
    eager after all (a guard that failed, a recompile limit reached).
    A profiler that cannot start (no CUPTI) is reported as an error, not raised: a
    missing profile must not fail the figure it explains."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=activities) as prof:
            with engine.micro_batch(last=True):
                engine.backward(engine.forward(*inputs)["loss"])
            if cuda:
                torch.cuda.synchronize(device)
    except Exception as error:  # a profiler that cannot start; the run itself is done
        return {"error": f"{type(error).__name__}: {error}"[:300]}
    finally:
        engine.zero_grad()
    events = prof.key_averages()
    times = own_times(events, cuda)
    calls = {name: sum(e.count for e in events if e.key.startswith(name))
             for name in (COMPILED_REGION, COMPILED_BACKWARD)}
    ranked = sorted(((name, ms) for name, ms in times.items() if ms > 0),
                    key=lambda row: -row[1])
    return {"time": "device (CUDA kernels)" if cuda else "CPU (self time per op)",
            "total_ms": round(sum(ms for _, ms in ranked), 3),
            "compiled_calls": {"forward": calls[COMPILED_REGION],
                               "backward": calls[COMPILED_BACKWARD]},
            "top": [[name, round(ms, 3)] for name, ms in ranked[:top]]}


def own_times(events: Any, device: bool) -> dict[str, float]:
    """torch.profiler's key_averages() -> milliseconds per op or kernel of its own time
    (its callees' apart, so the entries add up to the profiled work): on the device
    (CUDA kernels) or on the CPU. bench/train_side_by_side.py reads its profiles so too."""
    own = "self_device_time_total" if device else "self_cpu_time_total"
    times: dict[str, float] = {}
    for event in events:
        times[event.key] = times.get(event.key, 0.0) + getattr(event, own) / 1e3
    return times
