"""The check of a `train` run's first optimizer step against a step clipped by hand,
installed by tests/backends/sync_probe.py when $CLIP_PROBE_DIR is set (one launch per
backend serves tests/backends/test_host_syncs.py and tests/backends/test_clipping.py).

The loop's own `optimizer_step` is wrapped: around step 1 every rank hands over its
micro-batches, and the engine's full weights are gathered before and after the real step
(collectives on every rank: sharded engines assemble them; the sync probe does not count
them, they are the test's, not the loop's). The root rank then replays the
step in plain torch on one process: the whole global batch in one forward, backward, the
gradient's global norm, every gradient scaled by max_norm / (norm + 1e-6) when the norm
exceeds --clip_grad_norm, and one step of the task's own Adam; and the same step unclipped.
It writes both distances to the engine's weights into $CLIP_PROBE_DIR/clip.json.

Nothing of the engine is replaced: DeepSpeed clips inside its own step from its config's
gradient_clipping, the others through Engine.clip_grad_norm.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from dalle_dist.train import loop

#: torch's and DeepSpeed's guard against a zero norm, in the clip coefficient.
EPS = 1e-6


def hand_clipped_step(task: Any, weights: dict[str, torch.Tensor], batches: list[Any],
                      max_norm: float | None) -> tuple[dict[str, torch.Tensor], float]:
    """One Adam step of a fresh copy from `weights` on all `batches` at once, its gradient
    clipped by hand to max_norm (None: unclipped); the new weights and the pre-clip norm."""
    model = task.build_model()  # DALL-E's on the meta device: the copies become its weights
    model.load_state_dict({name: value.clone() for name, value in weights.items()},
                          assign=True)
    model.train()
    images = torch.cat([b[0] for b in batches])
    text = torch.cat([b[1] for b in batches])
    loss = model(*task.inputs((images, text, []), torch.device("cpu")))["loss"]
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    if max_norm is not None and norm > max_norm:
        for grad in grads:
            grad.mul_(max_norm / (norm + EPS))
    optimizer = task.make_optimizer(model.parameters())
    optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norm


def max_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def cpu_copy(state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    if state is None:  # not the root of a sharded engine
        return None
    return {k: v.detach().cpu().float().clone() for k, v in state.items()}


def wrap(real: Any, out: Path,
         unobserved: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
         ) -> Any:
    """The loop's optimizer_step, checked at step 1; `unobserved()` is entered around the
    probe's own work (the gathers and the replay)."""
    def optimizer_step(task: Any, engine: Any, backend: Any, micro_batches: list[Any],
                       config: Any, sums: Any, step: int) -> None:
        if step != 1:
            return real(task, engine, backend, micro_batches, config, sums, step)
        with unobserved():
            before = cpu_copy(engine.full_state_dict())  # (a live view: the step moves it)
            mine = [(b[0].cpu(), b[1].cpu()) for b in micro_batches]
            every = backend.all_gather_object(mine, "the clip probe's batches")
        real(task, engine, backend, micro_batches, config, sums, step)
        with unobserved():
            replay(task, backend, config, before, every, engine.full_state_dict(), out)
        return None
    return optimizer_step


def replay(task: Any, backend: Any, config: Any, before: dict[str, torch.Tensor] | None,
           every: list[Any], after_state: dict[str, torch.Tensor] | None, out: Path) -> None:
    """On the root: the step by hand, clipped and not, against the engine's weights."""
    after = cpu_copy(after_state)
    if backend.is_root:
        batches = [b for rank in every for b in rank]
        clipped, norm = hand_clipped_step(task, before, batches, config.clip_grad_norm)
        unclipped, _ = hand_clipped_step(task, before, batches, None)
        out.write_text(json.dumps({
            "max_norm": config.clip_grad_norm, "grad_norm": norm,
            "world_size": backend.world_size,
            "to_clipped": max_distance(after, clipped),
            "to_unclipped": max_distance(after, unclipped),
            "clipped_to_unclipped": max_distance(clipped, unclipped)}))


def install(out: Path, unobserved: Callable[[], AbstractContextManager[None]]) -> None:
    loop.optimizer_step = wrap(loop.optimizer_step, out, unobserved)
