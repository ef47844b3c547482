"""--optimizer, --weight_decay, --betas, --lr_schedule, --warmup_steps, --min_lr: the rate
at each optimizer step and what AdamW decays, in one process. On every backend and across a
resume they run in real processes: tests/backends/runs.py COMMON (every backend's 2-rank
run equals one process, with the rate logged at each step) and tests/train/test_resume.py
(resumed == uninterrupted, bit for bit, on one process with --ga_steps and under torchrun).
"""

from __future__ import annotations

import math

import pytest
import torch

from dalle_dist.errors import ConfigError
from dalle_dist.model import DALLE, DALLEConfig
from dalle_dist.train.config import OptimizerConfig
from dalle_dist.train.optim import embedding_weights, make_optimizer
from dalle_dist.train.schedule import LRShape, make_lr_scheduler


def spec_rate(step: int, kind: str, warmup: int, total: int, lr: float, min_lr: float) -> float:
    """The rate optimizer step `step` (1-based) takes, as the docs state it: warmup
    lr * step / warmup, then from lr at step warmup + 1 to min_lr at the last step."""
    if step <= warmup:
        return lr * step / warmup
    if kind == "constant":
        return lr
    progress = (step - warmup - 1) / (total - warmup - 1)
    shape = (1 + math.cos(math.pi * progress)) / 2 if kind == "cosine" else 1 - progress
    return min_lr + (lr - min_lr) * shape


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_the_scheduler_gives_each_step_the_documented_rate(kind: str) -> None:
    """LambdaLR stepped once per optimizer step, as DALLETask.after_step does: step k runs
    at spec_rate(k). Bugs caught: a warmup starting at 0 (the first step would not move
    the weights), a decay that never reaches --min_lr at the last step, or one that starts
    a step late or early."""
    lr, min_lr, warmup, total = 3e-3, 1e-4 if kind != "constant" else None, 4, 20
    optim = OptimizerConfig(lr_schedule=kind, warmup_steps=warmup, min_lr=min_lr
                            ).resolved(False, lr)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = make_lr_scheduler(optimizer, optim, lr, total)
    got = []
    for _ in range(total):
        got.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [spec_rate(k, kind, warmup, total, lr, min_lr or 0.0) for k in range(1, total + 1)]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert got[0] == pytest.approx(lr / warmup) and got[warmup - 1] == pytest.approx(lr)
    if kind != "constant":
        assert got[-1] == pytest.approx(min_lr)


def test_a_restored_scheduler_goes_on_where_it_stopped() -> None:
    """The scheduler's state dict at step 7, loaded into a fresh one built for another run
    length (a resume with more --epochs): the same rates from there, the saved schedule's,
    as docs/training.md says. Bug caught: a shape the state dict does not carry (a closure
    or a chain of schedulers: LambdaLR saves only a callable object's fields), which would
    take the new length's rates after a resume."""
    optim = OptimizerConfig(lr_schedule="cosine", warmup_steps=3).resolved(False, 1.0)
    shape_at = LRShape("cosine", 3, 15, 0.0)
    runs = []
    for stop in (None, 7):
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=1.0)
        scheduler = make_lr_scheduler(optimizer, optim, 1.0, 15)
        rates = []
        for step in range(15):
            if step == stop:
                state = scheduler.state_dict()
                optimizer = torch.optim.SGD([param], lr=1.0)
                scheduler = make_lr_scheduler(optimizer, optim, 1.0, 30)
                scheduler.load_state_dict(state)
                # LambdaLR restores last_epoch; the rate itself comes from its last step
                for group, rate in zip(optimizer.param_groups, scheduler.get_last_lr(),
                                       strict=True):
                    group["lr"] = rate
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        runs.append(rates)
    assert runs[0] == runs[1] == pytest.approx([shape_at(s) for s in range(15)])


def tiny_dalle() -> DALLE:
    torch.manual_seed(0)
    return DALLE(DALLEConfig(num_text_tokens=50, num_image_tokens=16, image_fmap_size=4,
                             dim=16, depth=2, heads=2, dim_head=8, text_seq_len=6))


def test_adamw_decays_the_linear_weights_only() -> None:
    """With zero gradients one AdamW step leaves Adam's update at 0, so every parameter is
    exactly its decay: Linear weights x (1 - lr x wd), everything else unchanged. Bugs
    caught: embeddings, norm gains or biases decayed; Adam's coupled L2 decay in place of
    AdamW's (the L2 term goes through Adam's normalisation: a step of about lr, not
    lr x wd x p); the --betas or --weight_decay not reaching the optimizer."""
    model = tiny_dalle()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr, wd = 0.1, 0.5
    optimizer = make_optimizer(model.parameters(), "adamw", lr, (0.8, 0.95), wd,
                               {id(p): n for n, p in model.named_parameters()},
                               embedding_weights(model))
    assert [g["betas"] for g in optimizer.param_groups] == [(0.8, 0.95)] * 2
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    decayed = set()
    for name, p in model.named_parameters():
        if torch.equal(p.detach(), before[name]):
            continue
        torch.testing.assert_close(p.detach(), before[name] * (1 - lr * wd))
        decayed.add(name)
    linear = {f"{m}.weight" for m, module in model.named_modules()
              if isinstance(module, torch.nn.Linear)}
    assert decayed == linear, decayed ^ linear
    assert {"text_emb.weight", "image_emb.weight", "text_pos_emb.weight"} <= (
        embedding_weights(model))


def test_without_weight_decay_one_group_as_before() -> None:
    """Adam with no decay keeps one parameter group: the optimizer state of checkpoints
    written before these flags (and DALLE-pytorch imports) loads as it always did."""
    model = tiny_dalle()
    optimizer = make_optimizer(model.parameters(), "adam", 1e-3, (0.9, 0.999), 0.0, {}, set())
    assert len(optimizer.param_groups) == 1 and type(optimizer) is torch.optim.Adam


@pytest.mark.parametrize(("kwargs", "lr_decay", "message"), [
    ({"warmup_steps": -1}, False, "--warmup_steps must be >= 0"),
    ({"weight_decay": -0.1}, False, "--weight_decay must not be negative"),
    ({"betas": (0.9, 1.0)}, False, "--betas must be two numbers in [0, 1)"),
    ({"lr_schedule": "plateau", "warmup_steps": 10}, False, "--warmup_steps cannot be"),
    ({"min_lr": 1e-5}, False, "--min_lr needs --lr_schedule"),
    ({"lr_schedule": "cosine", "min_lr": 1.0}, False, "--min_lr 1 is above --learning_rate"),
    ({"lr_schedule": "cosine"}, True, "--lr_decay is --lr_schedule plateau, not cosine"),
])
def test_contradictions_are_refused(kwargs: dict, lr_decay: bool, message: str) -> None:
    optim = OptimizerConfig(**kwargs)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        optim.validate()
        optim.resolved(lr_decay, 1e-3)


def test_defaults_resolve_as_documented() -> None:
    assert OptimizerConfig().resolved(False, 1e-3).lr_schedule == "constant"
    plateau = OptimizerConfig().resolved(True, 1e-3)
    assert (plateau.lr_schedule, plateau.min_lr) == ("plateau", 1e-6)
    adamw = OptimizerConfig(optimizer="adamw", lr_schedule="linear").resolved(False, 1e-3)
    assert (adamw.weight_decay, adamw.min_lr) == (0.01, 0.0)
    assert OptimizerConfig().resolved(False, 1e-3).weight_decay == 0.0
