"""train --eval_every_n_steps on 2 ranks: FSDP2 samples the evaluation through its shards
on both ranks (the root's captions, the other's placeholders, the same calls), the root
scores. Its metrics are the one process's (tests/train/test_quality.py checks those
against the images they were computed from).

Caught: torchmetrics' FID gathering its states from every rank in compute() (the other
rank was already in the next step: a hang, seen before sync_on_compute=False); the root
drawing for the placeholder captions (checked in a scratch copy: the CLIP score moved).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.backends.runs import Run
from tests.train.quality_files import eval_flags


def test_fsdp_measures_what_one_process_measures(trained: Callable[..., Run],
                                                 quality_files: Path) -> None:
    flags = eval_flags(quality_files)
    single, fsdp = trained("single", "fp32", *flags), trained("fsdp", "fp32", *flags)

    def measured(run: Run) -> dict[int, dict[str, float]]:
        return {r["step"]: {k: r[k] for k in ("fid", "clip_score", "caption_fidelity")}
                for r in run.metrics if "fid" in r}

    one, two = measured(single), measured(fsdp)
    assert sorted(two) == [2, 4, 5]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4), step


def test_fewer_captions_than_eval_images_take_the_same_calls_on_every_rank(
        trained: Callable[..., Run], quality_files: Path) -> None:
    """--eval_captions of 3 lines with --eval_images 8 on FSDP: the other rank samples
    the root's 3, not 8 (it made more sampling calls through the shards than the root,
    and the run ended at the collective timeout; reproduced by hand before the fix)."""
    run = trained("fsdp", "fp32", *eval_flags(quality_files), "--eval_captions",
                  str(quality_files / "captions.txt"))
    assert "evaluation every 2 steps and at the end: 3 images" in run.text
    assert [r["step"] for r in run.metrics if "clip_score" in r] == [2, 4, 5]
