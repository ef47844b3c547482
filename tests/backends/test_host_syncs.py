"""The training step never waits for the device except at a sync point, on every backend.

Each backend trains 2 ranks (1 for single) under tests/backends/sync_probe.py (the run
tests/backends/test_clipping.py reads too, tests/backends/conftest.py), which
records every host synchronisation (.item(), .tolist(), float(), bool(), .cpu(), ...)
and every collective, per optimizer step, with whose code made it. With
--log_every_n_steps 3 and --ga_steps 2 over a 7-step epoch, steps 3 and 6 log and step 7
ends the epoch; steps 1, 2, 4 and 5 must hold no host synchronisation of ours and no
collective of ours, and each log step exactly one all-reduce and one device-to-host copy
(the metrics and the stop flag, together). What the engines do inside their own code is
recorded and printed (pytest -s shows it), not asserted: it is theirs.

Accumulation: inside a micro-batch that is not its window's last, no backend whose engine
lets us skip it may exchange gradients (DDP's no_sync, FSDP2's requires_gradient_sync,
Horovod's backward_passes_per_step); DeepSpeed's ZeRO reduces per micro-batch by design and
is reported.

What would fail: any per-step `float(loss)`, `.tolist()` or `.item()` in the loop or an
engine (the code before this test had three: the loss/stop all-reduce read with
.tolist(), float() on each logged output, float() on the grad norm); a stop flag
all-reduced every step; a micro-batch that all-reduces its gradients.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.backends.conftest import PROBED, PROBED_LOG_EVERY, PROBED_STEPS

STEPS, LOG_EVERY = PROBED_STEPS, PROBED_LOG_EVERY
QUIET_STEPS = [1, 2, 4, 5]
#: Gradient exchanges an engine may skip inside a window (all-gathers of FSDP2's forward
#: and backward are parameters, not gradients).
GRADIENT_EXCHANGES = {"ddp_bucket_all_reduce", "reduce_scatter_single", "reduce_scatter_tensor",
                      "reduce_scatter", "horovod.allreduce_async_",
                      "horovod.grouped_allreduce_async_"}


def probe(name: str, probed_run: Callable[[str], Path]) -> list[dict[str, Any]]:
    folder = probed_run(name)
    world = 1 if name == "single" else 2
    records = [json.loads((folder / f"rank{r}.json").read_text())["steps"] for r in range(world)]
    # (events after the last step, the epoch-end save, are filed under step STEPS + 1)
    assert all(set(range(1, STEPS + 1)) <= set(map(int, steps)) for steps in records), \
        "the probe saw every optimizer step"
    return records


def by_owner(events: list[list[str]]) -> Counter[str]:
    return Counter(event[1] for event in events)


@pytest.mark.parametrize("name", PROBED)
def test_no_host_sync_outside_log_steps(name: str, probed_run: Callable[[str], Path]) -> None:
    records = probe(name, probed_run)
    world = len(records)
    for rank, steps in enumerate(records):
        report = {step: {"syncs": dict(by_owner(e["syncs"])),
                         "collectives": dict(by_owner(e["collectives"]))}
                  for step, e in sorted(steps.items(), key=lambda kv: int(kv[0]))}
        print(f"{name} rank {rank} per step: {json.dumps(report)}")
        for step in QUIET_STEPS:
            events = steps[str(step)]
            ours = [e for e in events["syncs"] + events["collectives"] if e[1] == "ours"]
            assert not ours, f"step {step} (not a log step) waits in our code: {ours}"
        for step in (LOG_EVERY, 2 * LOG_EVERY):
            events = steps[str(step)]
            our_syncs = [e for e in events["syncs"] if e[1] == "ours"]
            our_collectives = [e for e in events["collectives"] if e[1] == "ours"]
            assert [e[0] for e in our_syncs] == ["tolist"], our_syncs
            assert len(our_collectives) == (1 if world > 1 else 0), our_collectives
        if name.startswith("deepspeed"):
            continue
        inside = [e for s in steps.values() for e in s["collectives"]
                  if e[3] == "micro" and e[0] in GRADIENT_EXCHANGES]
        assert not inside, f"gradients exchanged inside an accumulation window: {inside[:3]}"
    if name in ("torch", "fsdp", "horovod"):
        exchanged = [e for e in records[0]["1"]["collectives"] if e[0] in GRADIENT_EXCHANGES]
        assert exchanged, "the probe sees the engine's gradient exchange at the boundary"
