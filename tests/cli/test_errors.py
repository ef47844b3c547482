"""docs/design.md "Errors": every user mistake ends as one `error: ... (...)` line and exit 2.

Each case runs the real CLI in a fresh process (cwd = tmp_path, every output pointed into
tmp_path) and checks the three halves of the contract: the message (one line, no traceback,
naming the flag or file at fault), the exit status, and that nothing was written: a
failed run must not leave a checkpoint, a metrics file, images or a temporary file behind
for the user to mistake for a result.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import TINY_DALLE_FLAGS, TINY_VAE_FLAGS, assert_user_error, run_cli

# A hang guard only: a failing command that never returns fails its test instead of stalling
# the suite. Whether a check ran before training is read off what the run printed and
# wrote (run_failing), never off how long it took: a tiny run trains in seconds.
ERROR_TIMEOUT_S = 90.0
#: What the training loop prints once it is reached: the model summary right before it,
#: the progress bar it starts (`train dalle`, `train vae`) and its first step's line.
LOOP_MARKERS = ("training a VAE:", "training DALL-E:", "train dalle", "train vae",
                "the first step's matmuls")


def snapshot(root: Path) -> set[str]:
    """Every file and folder under root (hidden ones too: atomic writes use `.name.*.tmp`).

    Folders count: a failed run should not leave empty output folders behind either.
    """
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def fill(args: Sequence[str], tmp: Path, vae: Path, dalle: Path) -> list[str]:
    """Parametrize tables cannot see fixtures, so they name paths by placeholder."""
    table = {"{tmp}": str(tmp), "{vae}": str(vae), "{dalle}": str(dalle)}
    out = []
    for arg in args:
        for key, value in table.items():
            arg = arg.replace(key, value)
        out.append(arg)
    return out


# Root ignores permission bits; without the capability that lets it, a 0o555 folder stops
# root's writes too, so the read-only case runs for real under either user.
UNPRIVILEGED = (["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
                if os.geteuid() == 0 else [])


def run_failing(tmp_path: Path, args: Sequence[str], *fragments: str,
                prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run the CLI, insist on the error contract, on no new file under tmp_path, and on
    the error coming before training: nothing the training loop prints was printed (fails
    for a check moved into the loop, even one that cleaned its files up before exiting).

    The built-in VAE cache is redirected into tmp_path too, so a command that wrongly fell
    back to training one would show up as new files rather than pollute the home folder.
    """
    before = snapshot(tmp_path)
    result = run_cli(*args, cwd=tmp_path, timeout=ERROR_TIMEOUT_S,
                     env={"DALLE_DIST_CACHE": str(tmp_path / "cache")}, prefix=prefix)
    assert_user_error(result, *fragments)
    after = snapshot(tmp_path)
    assert after == before, f"files left behind: {sorted(after - before)}"
    printed = result.stdout + result.stderr
    reached = [marker for marker in LOOP_MARKERS if marker in printed]
    assert not reached, f"the training loop was reached: {reached}\n{result.stdout}"
    return result


def write_png(path: Path, color: tuple[int, int, int] = (200, 30, 30)) -> None:
    """A 16x16 image, the size tiny_vae was trained on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), color).save(path)


# -- 1, 2: datasets -------------------------------------------------------------------


def test_train_missing_image_text_folder(tmp_path: Path, tiny_vae: Path) -> None:
    run_failing(tmp_path, ["train", "--image_text_folder", str(tmp_path / "nope"),
                           "--vae_path", str(tiny_vae),
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--image_text_folder", "nope", "does not exist")


def test_train_vae_missing_image_folder(tmp_path: Path) -> None:
    run_failing(tmp_path, ["train-vae", "--image_folder", str(tmp_path / "nope"),
                           *TINY_VAE_FLAGS, "--vae_output_file_name", str(tmp_path / "vae")],
                "--image_folder", "nope", "does not exist")


def make_folder(root: Path, kind: str) -> Path:
    """An image-text folder that exists but holds nothing trainable, in one of three ways."""
    folder = root / f"data-{kind}"
    folder.mkdir()
    if kind == "unreadable":
        for i in range(3):
            (folder / f"{i}.png").write_bytes(b"not a png at all")
            (folder / f"{i}.txt").write_text("a red circle\n")
    elif kind == "empty-captions":
        for i in range(3):
            write_png(folder / f"{i}.png")
            (folder / f"{i}.txt").write_text("\n   \n")
    return folder


@pytest.mark.parametrize(("kind", "reason"), [
    ("empty", "the folder is empty"),
    ("unreadable", "unreadable images"),
    ("empty-captions", "empty caption files"),
])
def test_train_unusable_folder(tmp_path: Path, tiny_vae: Path, kind: str, reason: str) -> None:
    folder = make_folder(tmp_path, kind)
    run_failing(tmp_path, ["train", "--image_text_folder", str(folder),
                           "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--image_text_folder", folder.name, "no usable", reason)


# -- 3, 4, 12: checkpoints -------------------------------------------------------------


def make_bad_checkpoint(root: Path, kind: str, tiny_dalle: Path) -> Path:
    """Random bytes (seeded, so the run is repeatable), half a real file, or nothing."""
    path = root / f"{kind}.pt"
    if kind == "random":
        path.write_bytes(random.Random(0).randbytes(4096))
    elif kind == "truncated":
        data = tiny_dalle.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("kind", ["random", "truncated", "missing"])
def test_generate_bad_dalle_path(tmp_path: Path, tiny_dalle: Path, kind: str) -> None:
    path = make_bad_checkpoint(tmp_path, kind, tiny_dalle)
    run_failing(tmp_path, ["generate", "--dalle_path", str(path), "--text", "a red circle",
                           "--outputs_dir", str(tmp_path / "out")],
                "--dalle_path", path.name)


def test_train_random_bytes_vae_path(tmp_path: Path, tiny_dalle: Path) -> None:
    path = make_bad_checkpoint(tmp_path, "random", tiny_dalle)
    run_failing(tmp_path, ["train", "--vae_path", str(path), *TINY_DALLE_FLAGS,
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--vae_path", path.name)


@pytest.mark.parametrize("command", ["generate", "train"])
def test_random_bytes_are_reported_as_corrupt_not_as_unsafe(
        tmp_path: Path, tiny_dalle: Path, command: str) -> None:
    """A damaged download must read as damaged; calling it a code-carrying pickle sends the
    user hunting for an attacker instead of re-copying the file."""
    path = make_bad_checkpoint(tmp_path, "random", tiny_dalle)
    if command == "generate":
        args = ["generate", "--dalle_path", str(path), "--text", "a red circle",
                "--outputs_dir", str(tmp_path / "out")]
    else:
        args = ["train", "--vae_path", str(path), *TINY_DALLE_FLAGS,
                "--dalle_output_file_name", str(tmp_path / "dalle")]
    line = run_failing(tmp_path, args, path.name).stderr
    assert "pickled Python objects" not in line, line
    assert "not a readable checkpoint" in line, line


@pytest.mark.parametrize(("args", "fragments"), [
    (["generate", "--dalle_path", "{vae}", "--text", "a red circle",
      "--outputs_dir", "{tmp}/out"], ["--dalle_path", "is a VAE checkpoint"]),
    (["train", "--vae_path", "{dalle}", *TINY_DALLE_FLAGS,
      "--dalle_output_file_name", "{tmp}/dalle"], ["--vae_path", "is a DALL-E checkpoint"]),
    (["train", "--dalle_path", "{vae}", *TINY_DALLE_FLAGS,
      "--dalle_output_file_name", "{tmp}/dalle"], ["--dalle_path", "is a VAE checkpoint"]),
], ids=["generate-dalle_path-vae", "train-vae_path-dalle", "train-dalle_path-vae"])
def test_checkpoint_of_the_wrong_kind(tmp_path: Path, tiny_vae: Path, tiny_dalle: Path,
                                      args: list[str], fragments: list[str]) -> None:
    run_failing(tmp_path, fill(args, tmp_path, tiny_vae, tiny_dalle), *fragments)


class TouchOnLoad:
    """Unpickling this runs Path.touch: a harmless stand-in for a malicious checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (pathlib.Path.touch, (self.marker,))


def test_pickled_object_checkpoint_is_refused_unread(tmp_path: Path) -> None:
    import torch

    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "kind": "dalle", "payload": TouchOnLoad(marker)}, evil)
    # Prove the trap works, so a missing marker below means "refused", not "harmless file".
    torch.load(evil, weights_only=False)
    assert marker.exists()
    marker.unlink()

    run_failing(tmp_path, ["generate", "--dalle_path", str(evil), "--text", "a red circle",
                           "--outputs_dir", str(tmp_path / "out")],
                "--dalle_path", "evil.pt", "refused")
    assert not marker.exists(), "loading the checkpoint ran code from it"


# -- 5, 6, 7, 10: flag values ------------------------------------------------------------


def test_train_vae_image_size_not_divisible(tmp_path: Path) -> None:
    run_failing(tmp_path, ["train-vae", "--image_size", "30", "--num_layers", "2",
                           "--vae_output_file_name", str(tmp_path / "vae")],
                "--image_size 30", "--num_layers 2")


BAD_TRAIN_VALUES = [("--batch_size", "0"), ("--batch_size", "-1"), ("--epochs", "0"),
                    ("--learning_rate", "-0.1"), ("--collective_timeout", "0")]


@pytest.mark.parametrize(("flag", "value"), BAD_TRAIN_VALUES)
def test_train_vae_bad_training_value(tmp_path: Path, flag: str, value: str) -> None:
    run_failing(tmp_path, ["train-vae", *TINY_VAE_FLAGS, flag, value,
                           "--vae_output_file_name", str(tmp_path / "vae")], flag, value)


@pytest.mark.parametrize(("flag", "value"), BAD_TRAIN_VALUES)
def test_train_bad_training_value(tmp_path: Path, tiny_vae: Path, flag: str, value: str
                                  ) -> None:
    run_failing(tmp_path, ["train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, flag, value,
                           "--dalle_output_file_name", str(tmp_path / "dalle")], flag, value)


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--rotary_emb", "--dim_head", "4"], "--rotary_emb needs --dim_head >= 6"),
    (["--shift_tokens", "--dim", "2"], "--shift_tokens needs --dim >= 4"),
], ids=["rotary_emb-dim_head-4", "shift_tokens-dim-2"])
def test_train_model_option_too_small(tmp_path: Path, tiny_vae: Path, flags: list[str],
                                      fragment: str) -> None:
    """A head too narrow for three rotary bands, a model too narrow for a top and a left
    quarter: refused before anything is written (not rotary doing nothing)."""
    run_failing(tmp_path, ["train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS, *flags,
                           "--dalle_output_file_name", str(tmp_path / "dalle")], fragment)


def test_train_builtin_vae_epochs_zero(tmp_path: Path) -> None:
    run_failing(tmp_path, ["train", *TINY_DALLE_FLAGS, "--builtin_vae_epochs", "0",
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--builtin_vae_epochs must be >= 1")


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--text", ""], "--text"),
    (["--text", "a red circle|"], "--text"),
    (["--text", "a red circle", "--num_images", "0"], "--num_images"),
    (["--text", "a red circle", "--top_k", "1.5"], "--top_k"),
    (["--text", "a red circle", "--temperature", "0"], "--temperature"),
], ids=["empty-text", "empty-second-prompt", "num_images-0", "top_k-1.5", "temperature-0"])
def test_generate_bad_value(tmp_path: Path, tiny_dalle: Path, flags: list[str], fragment: str
                            ) -> None:
    run_failing(tmp_path, ["generate", "--dalle_path", str(tiny_dalle), *flags,
                           "--outputs_dir", str(tmp_path / "out")], fragment)


def test_unknown_attention_pattern_lists_valid_ones(tmp_path: Path, tiny_vae: Path) -> None:
    run_failing(tmp_path, ["train", "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                           "--attn_types", "full,nope",
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--attn_types", "'nope'", "valid:", "full")


def test_vae_path_with_dalle_path(tmp_path: Path, tiny_vae: Path, tiny_dalle: Path) -> None:
    run_failing(tmp_path, ["train", "--vae_path", str(tiny_vae), "--dalle_path", str(tiny_dalle),
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--vae_path", "--dalle_path")


# -- 8: outputs that cannot be written ------------------------------------------------------


def output_args(command: str, target: str, tiny_vae: Path, tiny_dalle: Path) -> list[str]:
    """A command that would train (or sample) for minutes if its output were checked late."""
    if command == "train-vae":
        return ["train-vae", "--vae_output_file_name", target]
    if command == "train":
        return ["train", "--vae_path", str(tiny_vae), "--dalle_output_file_name", target]
    return ["generate", "--dalle_path", str(tiny_dalle), "--text", "a red circle",
            "--num_images", "64", "--outputs_dir", target]


OUTPUT_FLAGS = {"train-vae": "--vae_output_file_name", "train": "--dalle_output_file_name",
                "generate": "--outputs_dir"}
COMMANDS = list(OUTPUT_FLAGS)


def assert_fast_and_clean(tmp_path: Path, args: list[str], *fragments: str,
                          prefix: Sequence[str] = ()) -> None:
    """The failure comes before training and leaves no checkpoint or metrics anywhere.

    "Before training" is read off the output: the loop's first words ("training a VAE",
    "training DALL-E", a dataset summary) must never have been printed.
    """
    result = run_failing(tmp_path, args, *fragments, prefix=prefix)
    assert "training" not in result.stdout and "found" not in result.stdout, result.stdout
    assert "built-in shapes" not in result.stdout, result.stdout
    leftovers = [p for p in tmp_path.rglob("*")
                 if p.is_file() and p.suffix in (".pt", ".jsonl", ".png", ".tmp")]
    assert not leftovers, leftovers


@pytest.mark.parametrize("command", COMMANDS)
def test_output_under_read_only_dir(tmp_path: Path, tiny_vae: Path, tiny_dalle: Path,
                                    command: str) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert_fast_and_clean(
            tmp_path, output_args(command, str(locked / "out"), tiny_vae, tiny_dalle),
            OUTPUT_FLAGS[command], "locked", "Permission denied", prefix=UNPRIVILEGED)
    finally:
        locked.chmod(0o755)  # so pytest can clean tmp_path up


@pytest.mark.parametrize("command", COMMANDS)
def test_output_under_regular_file(tmp_path: Path, tiny_vae: Path, tiny_dalle: Path,
                                   command: str) -> None:
    """Fails for root too: nothing can be created inside a regular file."""
    (tmp_path / "afile").write_text("not a folder\n")
    assert_fast_and_clean(
        tmp_path, output_args(command, str(tmp_path / "afile" / "out"), tiny_vae, tiny_dalle),
        OUTPUT_FLAGS[command], "afile")


@pytest.mark.parametrize("command", COMMANDS)
def test_output_is_the_wrong_kind_of_path(tmp_path: Path, tiny_vae: Path, tiny_dalle: Path,
                                          command: str) -> None:
    """A checkpoint name that is a folder, or an outputs folder that is a file."""
    if command == "generate":
        taken = tmp_path / "taken"
        taken.write_text("not a folder\n")
    else:
        taken = tmp_path / "taken.pt"  # with .pt, so the name is not turned into taken.pt.pt
        taken.mkdir()
    assert_fast_and_clean(tmp_path, output_args(command, str(taken), tiny_vae, tiny_dalle),
                          OUTPUT_FLAGS[command], "taken")


# -- 9: captions that do not fit -------------------------------------------------------------


LONG_CAPTION = " ".join(["a big red circle on the left"] * 3)[:80]


def long_caption_folder(root: Path) -> Path:
    folder = root / "data"
    write_png(folder / "0.png")
    (folder / "0.txt").write_text(LONG_CAPTION + "\n")
    return folder


def test_caption_longer_than_text_seq_len(tmp_path: Path, tiny_vae: Path) -> None:
    assert len(LONG_CAPTION) == 80
    folder = long_caption_folder(tmp_path)
    run_failing(tmp_path, ["train", "--image_text_folder", str(folder),
                           "--vae_path", str(tiny_vae), *TINY_DALLE_FLAGS,
                           "--epochs", "1", "--batch_size", "1", "--fidelity_images", "0",
                           "--dalle_output_file_name", str(tmp_path / "dalle")],
                "--text_seq_len 40", "--truncate_captions")


def test_truncate_captions_lets_the_same_run_train(tmp_path: Path, tiny_vae: Path) -> None:
    """The fix the error names must actually work."""
    folder = long_caption_folder(tmp_path)
    result = run_cli("train", "--image_text_folder", str(folder), "--vae_path", str(tiny_vae),
                     *TINY_DALLE_FLAGS, "--epochs", "1", "--batch_size", "1",
                     "--fidelity_images", "0", "--truncate_captions",
                     "--dalle_output_file_name", str(tmp_path / "dalle"), cwd=tmp_path,
                     env={"DALLE_DIST_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dalle.pt").is_file()


# -- 11, 13: argparse ------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "fragment"), [
    (["train", "--no_such_flag"], "--no_such_flag"),
    (["train-vae", "--epochs", "many"], "--epochs"),
    ([], "COMMAND"),
], ids=["unknown-flag", "non-integer-epochs", "missing-subcommand"])
def test_argparse_mistakes_follow_the_contract(tmp_path: Path, args: list[str], fragment: str
                                               ) -> None:
    run_failing(tmp_path, args, fragment, "--help")


@pytest.mark.parametrize(("command", "flags"), [
    ("train-vae", ["--image_folder", "--image_size", "--num_layers", "--batch_size",
                   "--vae_output_file_name"]),
    ("train", ["--image_text_folder", "--vae_path", "--dalle_path", "--truncate_captions",
               "--attn_types", "--dalle_output_file_name"]),
    ("generate", ["--dalle_path", "--text", "--num_images", "--top_k", "--outputs_dir"]),
])
def test_help(tmp_path: Path, command: str, flags: list[str]) -> None:
    result = run_cli(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for flag in flags:
        assert flag in result.stdout, flag
    assert list(tmp_path.iterdir()) == []


def test_helpers_see_hidden_files(tmp_path: Path) -> None:
    """snapshot() must catch `.name.*.tmp` leftovers of an interrupted atomic write."""
    (tmp_path / ".vae.pt.abc.tmp").write_bytes(b"")
    assert snapshot(tmp_path) == {".vae.pt.abc.tmp"}
