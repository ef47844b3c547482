"""fp16 on 2 ranks: an inf in ONE rank's gradient makes EVERY rank skip that step.

GradScaler skips a step whose gradients hold an inf or a nan and halves the loss scale.
Each rank decides from the gradients it reads, so the decision must be shared: a rank
that steps while another skips leaves the replicas (or the shards) out of step, and the
loss scales apart, for the rest of the run.

- torch (DDP): gradients are averaged in backward, so an inf on one rank is in everyone's.
- fsdp (FSDP2): each rank unscales only its gradient shard; the inf lands in one shard.
  torch's GradScaler agrees only because DTensor all-reduces found-inf (MAX) in
  `_amp_foreach_non_finite_check_and_unscale_` (torch.distributed.tensor._dispatch,
  found_inf_reduce_handler). Broken on purpose by removing that handler: rank 1 stepped
  on the poisoned step and kept scale 65536 while rank 0 skipped and halved.
- horovod: gradients are all-reduced asynchronously, in place. HorovodEngine waits for
  them (synchronize) before the scaler unscales and checks them. Broken on purpose by
  restoring the old step (no wait without clipping, as train-vae runs): rank 1 found its
  own inf before the average, skipped the step, so Horovod's optimizer never synchronized,
  and its next zero_grad() raised ("zero_grad() was called after loss.backward() but
  before optimizer.step() or optimizer.synchronize()"): the run died at fp16's first
  overflow. HOROVOD_CYCLE_TIME slows Horovod's background cycle so that an all-reduce is
  still pending whenever something reads the gradients too early.
- single: the reference (one rank skips, the scale halves).
DeepSpeed refuses fp16 on CPU (tests/backends/test_precision.py).

The poison is the test model's own: an autograd function that puts an inf into one
element of its last layer's weight gradient on rank 1 at steps 2 and 4, before any engine has
reduced it. That element's row lives in rank 0's FSDP shard, so under FSDP the rank that
made the inf is not the rank that finds it.

The file is also the rank script: `python -m tests.backends.test_fp16_agreement BACKEND
OUT` under a launcher builds the engine through backend_from_config and distribute, as
`train` does, and writes what each rank saw to OUT/rank-N.json.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests import launch

STEPS, POISONING_RANK = 4, 1
#: Step 2 overflows unclipped (train-vae's path: the scaler unscales inside step()),
#: step 4 clipped (train's: clip_grad_norm unscales first).
POISONED_STEPS, CLIPPED_STEPS = {2, 4}, {3, 4}
INITIAL_SCALE = 2.0 ** 16
REPO = Path(__file__).resolve().parents[2]


class InfIntoGradient(torch.autograd.Function):
    """Identity forward; backward puts an inf into element [0, 0] of the gradient."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor) -> torch.Tensor:
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[0, 0] = float("inf")
        return grad


class Tiny(nn.Module):
    """Two blocks (FSDP's shard units) and a head whose weight gradient can be poisoned."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor, poison: bool = False
                ) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        weight = InfIntoGradient.apply(self.head.weight) if poison else self.head.weight
        out = nn.functional.linear(x, weight, self.head.bias)
        return (out.float() - target).square().mean()


def rank_main(name: str, out: Path) -> None:
    """Train Tiny for STEPS fp16 steps on this rank; record each step's outcome."""
    from dalle_dist.backends.config import DistributedConfig
    from dalle_dist.backends.registry import backend_from_config
    from dalle_dist.errors import DalleDistError

    backend = backend_from_config(DistributedConfig(
        backend=None if name == "single" else name, precision="fp16", collective_timeout=120))
    backend.initialize()
    torch.manual_seed(0)
    model = Tiny()
    engine = backend.distribute(model, lambda params: torch.optim.Adam(params, lr=1e-2),
                                lambda optimizer: None, shard_units=list(model.blocks))
    rank, world = backend.rank, backend.world_size
    steps = []
    for step in range(1, STEPS + 1):
        data = torch.Generator().manual_seed(step)
        x, target = torch.randn(8, 8, generator=data), torch.randn(8, 4, generator=data)
        mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
        poison = step in POISONED_STEPS and rank == min(POISONING_RANK, world - 1)
        before = engine.rank_digest()
        loss = engine.forward(x[mine], target[mine], poison=poison)
        engine.backward(loss)
        engine.clip_and_step(1.0 if step in CLIPPED_STEPS else None)
        engine.zero_grad()
        steps.append({"step": step, "changed": engine.rank_digest() != before,
                      "scale": engine.loss_scale})
    adam_steps = sorted({int(s["step"]) for s in engine.optimizer.state.values()})
    weights = engine.full_state_dict()  # collective on FSDP
    finite = all(bool(torch.isfinite(p.detach().to_local() if hasattr(p, "to_local") else p)
                      .all()) for p in engine.module.parameters())
    result = {"rank": rank, "world": world, "steps": steps, "adam_steps": adam_steps,
              "digest": engine.rank_digest(), "finite": finite}
    if name == "fsdp":  # (here to share the launch) ranks that built different weights
        from dalle_dist.model.init import with_heads

        torch.manual_seed(rank)
        heads: dict[str, bytes] = {}
        for _ in with_heads(Tiny().named_parameters(), heads):  # as FSDP fills its shards
            pass
        try:
            backend.check_same_weights(heads)  # type: ignore[attr-defined]
        except DalleDistError as error:
            result["different_weights_error"] = str(error)
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    if weights is not None:
        torch.save({k: v.detach().cpu().float() for k, v in weights.items()},
                   out / "weights.pt")
    backend.shutdown()



SCRIPT = ["-m", "tests.backends.test_fp16_agreement"]


def run_ranks(name: str, out: Path) -> list[dict[str, Any]]:
    """One launch of the rank script on `name` (2 ranks; 1 for single)."""
    port = str(launch.free_port())
    env: dict[str, str] = {}
    if name == "single":
        cmd = [sys.executable, *SCRIPT, name, str(out)]
    elif name == "horovod":
        cmd = [str(launch.BIN / "horovodrun"), "-np", "2", "--gloo", sys.executable, *SCRIPT,
               name, str(out)]
        env["HOROVOD_CYCLE_TIME"] = "200"  # ms: the all-reduce is still pending at unscale
    else:
        cmd = [str(launch.BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", port,
               *SCRIPT, name, str(out)]
    result = launch.finish(launch.start(cmd, cwd=REPO, env=env), timeout=240)
    assert result.returncode == 0, launch.output(result)[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text())
            for rank in range(1 if name == "single" else 2)]


Launched = Callable[[str], tuple[list[dict[str, Any]], dict[str, torch.Tensor]]]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """backend name -> (what each rank saw, the weights gathered on rank 0), launched once."""
    done: dict[str, tuple[list[dict[str, Any]], dict[str, torch.Tensor]]] = {}

    def get(name: str) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
        if name not in done:
            out = tmp_path_factory.mktemp(f"fp16-{name}")
            done[name] = (run_ranks(name, out),
                          torch.load(out / "weights.pt", weights_only=True))
        return done[name]
    return get


@pytest.mark.parametrize("name", ["single", "torch", "fsdp", "horovod"])
def test_every_rank_skips_the_step_one_rank_overflowed(name: str, launched: Launched) -> None:
    ranks, weights = launched(name)
    for seen in ranks:
        rank = seen["rank"]
        changed = [s["changed"] for s in seen["steps"]]
        assert changed == [s not in POISONED_STEPS for s in range(1, STEPS + 1)], (
            f"rank {rank}: parameters changed on steps {changed} (False: skipped); steps "
            f"{sorted(POISONED_STEPS)} must be skipped, on every rank")
        scales = [s["scale"] for s in seen["steps"]]
        assert scales == [INITIAL_SCALE, INITIAL_SCALE / 2, INITIAL_SCALE / 2,
                          INITIAL_SCALE / 4], f"rank {rank}: loss scales {scales}"
        assert seen["adam_steps"] == [STEPS - len(POISONED_STEPS)], (
            f"rank {rank}: Adam steps {seen['adam_steps']}")
        assert seen["finite"], f"rank {rank}: non-finite weights"
    digests = [seen["digest"] for seen in ranks]
    if name == "fsdp":  # shards differ by design; put together they must hold DDP's model
        assert len(set(digests)) == len(digests), digests
    else:
        assert len(set(digests)) == 1, f"replicas differ after the skipped step: {digests}"
    if name != "single":  # 2 ranks x 4 samples == 1 process x 8 (observed <= 4.2e-5)
        expected = launched("single")[1]
        assert weights.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.allclose(weights[key], value, rtol=0, atol=1e-3), (
                key, (weights[key] - value).abs().max().item())



def test_fsdp_refuses_ranks_that_built_different_weights(launched: Launched) -> None:
    """FSDP takes its initial weights from identical seeding, not a broadcast: ranks that
    drew different ones (a rank-dependent seed, different checkpoint files per node) would
    each train a shard of a different model, which no digest at the end can show. Broken
    on purpose (check_same_weights returning at once): no error on either rank."""
    ranks, _ = launched("fsdp")
    for seen in ranks:
        error = seen.get("different_weights_error", "")
        assert "the ranks built different initial weights" in error, seen
        assert "--seed" in error


if __name__ == "__main__":
    from dalle_dist.cli.exits import exit_now

    rank_main(sys.argv[1], Path(sys.argv[2]))
    # As `train` ends a rank: the interpreter's teardown of torch's native state can abort
    # a rank that has finished ("terminate called without an active exception"; CI saw it
    # once on FSDP after both ranks had written their results).
    exit_now(0)
