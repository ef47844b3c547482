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
