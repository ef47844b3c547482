"""`dalle-dist <command>`: flags -> typed configs -> one call per command.

The only place where a DalleDistError becomes `error: ...` and exit status 2.

A command's module is imported only when that command runs: `dalle-dist --help` lists the
commands from COMMANDS alone, and `doctor` or `check --help` never pay for torch (about
two seconds of start-up on a small machine, for commands that read a log or print flags).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from dalle_dist import __version__
from dalle_dist.cli.exits import exit_now
from dalle_dist.cli.parser import (
    ArgumentParser,
    add_launcher_rank,
    given_dests,
    subcommand_parser,
)
from dalle_dist.errors import DalleDistError, Stopped


class Command(NamedTuple):
    """Where a command's flags are declared: `adder(parser)` in `module` (dalle_dist.cli.<module>,
    or a full dotted path). Named by string, as an entry point is: `selftest` sits above the
    CLI it drives (docs/design.md, "Layers"), and the CLI imports no command it does not run."""

    module: str
    adder: str
    help: str

    def add_to(self, parser: ArgumentParser) -> None:
        path = self.module if "." in self.module else f"dalle_dist.cli.{self.module}"
        add: Callable[[ArgumentParser], None] = getattr(importlib.import_module(path),
                                                        self.adder)
        add(parser)


#: Every command, in the order `dalle-dist --help` lists them.
COMMANDS: dict[str, Command] = {
    "train-vae": Command("train_cmds", "add_train_vae",
                         "train the discrete VAE that turns images into tokens"),
    "train": Command("train_cmds", "add_train",
                     "train DALL-E (trains a VAE first on built-in data)"),
    "encode": Command("train_cmds", "add_encode",
                      "encode a data set's images once into token shards for train "
                      "--token_shards"),
    "generate": Command("generate_cmd", "add_generate", "sample images from a trained DALL-E"),
    "checkpoint": Command("checkpoint_cmd", "add_checkpoint",
                          "inspect, convert, verify or export a checkpoint"),
    "check": Command("check_cmd", "add_check",
                     "what this machine can run: torch, devices, engines, and a verdict per "
                     "backend and precision"),
    "doctor": Command("doctor_cmd", "add_doctor",
                      "read a failed run's log: root cause, fix and a check"),
    "plan": Command("plan_cmd", "add_plan",
                    "memory per GPU of a training run, per backend, ZeRO stage and "
                    "precision, and which to use"),
    "selftest": Command("dalle_dist.selftest.command", "add_selftest",
                        "prove this machine trains, resumes and samples correctly: one "
                        "PASS / FAIL line per check and a JSON report"),
    "flags": Command("flags_cmd", "add_flags_reference",
                     "every flag of every command, with its default and help (docs/flags.md)"),
}


def build_parser(commands: Iterable[str] | None = None) -> ArgumentParser:
    """The parser of `dalle-dist`; only the commands named in `commands` (default: all)
    get their flags, the others only their name and help."""
    wanted = set(COMMANDS if commands is None else commands)
    parser = ArgumentParser(
        prog="dalle-dist",
        description="Train and sample DALL-E style text-to-image models; the distributed "
                    "backend, precision and attention pattern are flags.")
    parser.add_argument("--version", action="version", version=f"dalle_dist {__version__}")
    add_launcher_rank(parser)  # the deepspeed launcher puts it before the subcommand
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if name in wanted:
            command.add_to(p)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command argv runs: the first word that names one (the options before it are the
    top-level parser's, whose values are never command names)."""
    return next((word for word in argv if word in COMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(argv)
    parser = build_parser([] if command is None else [command])
    args = parser.parse_args(argv)
    sub = subcommand_parser(parser, args.command)
    args.given = given_dests(sub, argv) if sub is not None else set()
    try:
        status = args.run(args)
    except DalleDistError as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = exc.exit_status
    except Stopped as exc:
        if str(exc):  # the root rank's message; the others stay quiet
            print(str(exc), flush=True)
        status = 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except BrokenPipeError:
        # The reader left (`dalle-dist doctor LOG | head -2`): stop quietly, with the status
        # of a process SIGPIPE ended, instead of a traceback; stdout goes to /dev/null so
        # the interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 128 + 13
    if getattr(args, "joined_process_group", False):
        exit_now(status)
    return status
