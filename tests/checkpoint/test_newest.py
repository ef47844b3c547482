"""`--resume auto`'s choice between `NAME.pt` and `NAME-ds-cp/` when they differ in age.

A DeepSpeed run writes `NAME.pt` before its first step, on a stop and at its end only, so
a run killed by SIGKILL leaves `NAME.pt` older than its newest tag; a later run of another
backend that resumed the directory leaves `NAME.pt` newer. Both are written here by the
writers a run uses (write_checkpoint_file, write_tag_meta, publish_tag): the choice reads
only their metadata. The tests/backends/test_ds_checkpoints.py runs watch `NAME.pt` stay
old while a real DeepSpeed run saves tags.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from dalle_dist.checkpoint.deepspeed_dir import ds_checkpoint_dir, publish_tag, write_tag_meta
from dalle_dist.checkpoint.format import LoopState, checkpoint_meta, write_checkpoint_file
from dalle_dist.checkpoint.resume import newest_checkpoint
from dalle_dist.train.config import RunPaths


class Quiet:
    def info(self, message: str) -> None:
        raise AssertionError(f"nothing to warn about: {message}")


def meta(step: int, epoch: int = 0) -> dict:
    return checkpoint_meta("dalle", {"model": {}}, asdict(LoopState(epoch, step)), [],
                           "deepspeed", 2, precision="fp32")


def write_single(paths: RunPaths, step: int) -> None:
    write_checkpoint_file(paths.checkpoint, {**meta(step), "weights": {}, "optimizer": None})


def write_tag(paths: RunPaths, step: int) -> Path:
    directory = ds_checkpoint_dir(paths.checkpoint)
    tag = f"global_step{step}"
    (directory / tag).mkdir(parents=True, exist_ok=True)
    write_tag_meta(directory, tag, meta(step))
    publish_tag(directory, tag, None)
    return directory


def test_the_directory_wins_over_an_older_single_file(tmp_path: Path) -> None:
    """A DeepSpeed run killed after periodic saves: NAME.pt from its start (step 0), tags up
    to step 12. Bug caught: a choice that takes NAME.pt whenever it exists, which would
    restart the run from step 0."""
    paths = RunPaths.for_output(str(tmp_path / "dalle"))
    write_single(paths, 0)
    write_tag(paths, 6)
    directory = write_tag(paths, 12)
    assert newest_checkpoint(paths, Quiet()) == directory


def test_a_tie_goes_to_the_directory_and_a_newer_single_file_wins(tmp_path: Path) -> None:
    """At a stop or the end both are written at the same step: the directory holds the
    optimizer's partitions. A run of another backend resumed from the directory saves
    only NAME.pt: that newer file is the newest checkpoint."""
    paths = RunPaths.for_output(str(tmp_path / "dalle"))
    directory = write_tag(paths, 12)
    write_single(paths, 12)
    assert newest_checkpoint(paths, Quiet()) == directory
    write_single(paths, 18)
    assert newest_checkpoint(paths, Quiet()) == paths.checkpoint
