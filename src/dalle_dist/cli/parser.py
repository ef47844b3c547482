"""argparse with docs/design.md's error contract: one line on stderr, exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """Reports a bad flag as `error: ... (see PROG --help)` instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def given_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options written on the command line, as opposed to defaults.

    A resumed run must tell `--dim 128` typed by the user (checked against the
    checkpoint) from dim's default (taken from the checkpoint).
    """
    actions = parser._option_string_actions  # argparse keeps this map private
    given = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        option = token.split("=", 1)[0]
        matches = [option] if option in actions else [
            name for name in actions if name.startswith(option)]
        if len(matches) == 1:
            given.add(actions[matches[0]].dest)
    return given


def subcommand_parser(parser: argparse.ArgumentParser, command: str
                      ) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None


def add_launcher_rank(parser: argparse.ArgumentParser) -> None:
    """Accept --local_rank=N, which the deepspeed launcher (and torch.distributed.launch)
    pass before the subcommand or after it. Its value is never read: a backend takes the
    rank's device from LOCAL_RANK, which every launcher sets. SUPPRESS keeps a
    subcommand's copy from overwriting the top-level one."""
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)
