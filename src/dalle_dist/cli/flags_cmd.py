"""`dalle-dist flags`: every command's flags, read from the parsers the config dataclasses
generate, so the reference cannot drift from the code.

`dalle-dist flags --markdown > docs/flags.md` writes the repository's reference; a test
fails when the checked-in file differs from what this prints.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

HEADER = """# Flags

Every flag of every `dalle-dist` command, with its default. This file is generated from
the config dataclasses by `dalle-dist flags --markdown > docs/flags.md`, and a test fails
when it differs from what that command prints: edit the help in the code, not here.
"""


def add_flags_reference(p: argparse.ArgumentParser) -> None:
    p.description = ("Print every flag of every command with its default and help, as "
                     "`--help` shows them; --markdown prints docs/flags.md.")
    p.add_argument("--markdown", action="store_true",
                   help="print the Markdown reference (docs/flags.md) instead of plain text")
    p.set_defaults(run=run_flags)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its actions private
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _shown(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[str, str]:
    """(the flag as --help writes it, its help with the default filled in)."""
    formatter = parser._get_formatter()
    return (formatter._format_action_invocation(action),
            formatter._expand_help(action) if action.help else "")


def documented(parser: argparse.ArgumentParser, prog: str
               ) -> Iterator[tuple[str, str, list[tuple[str, str]]]]:
    """(command line, description, [(flag, help)]) for `parser` and each sub-command below
    it; flags hidden from --help (--local_rank) are left out."""
    rows = [_shown(parser, action) for action in parser._actions
            if action.option_strings and action.help != argparse.SUPPRESS
            and not isinstance(action, argparse._HelpAction | argparse._VersionAction)]
    children = _subparsers(parser)
    if rows or not children:
        yield prog, parser.description or "", rows
    for name, child in children.items():
        yield from documented(child, f"{prog} {name}")


def markdown() -> str:
    from dalle_dist.cli import build_parser

    parts = [HEADER]
    for prog, description, rows in documented(build_parser(), "dalle-dist"):
        if prog == "dalle-dist":
            continue  # --version and --help only
        parts.append(f"\n## `{prog}`\n\n{description}\n")
        if rows:
            parts.append("\n| flag | meaning |\n| --- | --- |\n")
            parts += [f"| `{_cell(flag)}` | {_cell(help_text)} |\n" for flag, help_text in rows]
    return "".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def plain() -> str:
    from dalle_dist.cli import build_parser

    lines = []
    for prog, _, rows in documented(build_parser(), "dalle-dist"):
        lines += [f"{prog} {flag}: {help_text}" for flag, help_text in rows]
    return "\n".join(lines)


def run_flags(args: argparse.Namespace) -> int:
    print(markdown() if args.markdown else plain(), end="\n" if not args.markdown else "")
    return 0
