"""Every command line the README and docs/ show parses with the real parser, so a flag that is
renamed or removed in the code cannot live on in the documentation (docs/design.md, "Errors":
a wrong flag is an exit 2 the user meets on their first copy-paste).

Seen failing: with check's `--cuda-smoke` renamed in cli/check_cmd.py, diagnose.md's
`dalle-dist check --cuda-smoke` fails; with checkpoint's `verify` renamed, the README's and
checkpoints.md's `checkpoint verify` lines fail.

What counts as a command: a line in a fenced code block that runs `dalle-dist ...`, the
module (`-m dalle_dist` or `--module dalle_dist`, alone or under a launcher) or the Docker
image, with its backslash continuations joined. A `...` stands for "your other flags" and
is dropped, as are `# comments`, pipes and redirections. Synopsis lines with
`[optional | choices]` are not commands and are skipped.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dalle_dist.cli import build_parser, chosen_command

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PROGRAMS = ("dalle-dist ", ".venv/bin/dalle-dist ", "docker run ", "torchrun ", "deepspeed ",
             "horovodrun ", "python ", "srun ", "mpirun ")


def _code_lines(text: str) -> list[str]:
    """The lines inside fenced code blocks, continuations joined."""
    lines, inside, pending = [], False, ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        lines.append(line)
    return lines


def _argv(line: str) -> list[str] | None:
    """The arguments after the program, or None when the line runs no dalle-dist command."""
    if not line.startswith(_PROGRAMS):
        return None  # a log line or some output, which need not be shell
    words = shlex.split(line, comments=True)
    if words and words[0].rsplit("/", 1)[-1] == "dalle-dist":
        start = 1
    elif words[:2] == ["docker", "run"] and "--entrypoint" not in words and "dalle-dist" in words:
        start = words.index("dalle-dist") + 1  # the image, whose entry point is dalle-dist
    else:
        start = next((i + 2 for i, w in enumerate(words[:-1])
                      if w in {"-m", "--module"} and words[i + 1] == "dalle_dist"), None)
        if start is None:
            return None
    cut = next((i for i, w in enumerate(words) if i >= start and (
        w in {"|", "&&", "2>&1"} or w.startswith((">", "<", "2>")))), len(words))
    words = [w for w in words[start:cut] if w != "..."]
    if any(w.startswith("[") for w in words):
        return None  # a synopsis: dalle-dist selftest [--device auto|cpu|cuda] ...
    return words


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for line in _code_lines(page.read_text()):
            argv = _argv(line)
            if argv is not None:
                found.append((f"{page.relative_to(ROOT)}: {line[:70]}", argv))
    return found


COMMANDS = documented_commands()


def test_the_pages_show_every_command() -> None:
    """The scan itself can fail: it must find the README's examples of each command."""
    shown = {chosen_command(argv) for _, argv in COMMANDS}
    assert {"train", "train-vae", "encode", "generate", "checkpoint", "check", "doctor", "plan",
            "selftest", "flags"} <= shown, shown
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where: str, argv: list[str],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser([chosen_command(argv) or ""])
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}\n  exit {exc.code}: {capsys.readouterr().err.strip()}")
