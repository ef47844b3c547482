"""`dalle-dist <command>`: flags -> typed configs -> one call per command.

The only place where a DalleDistError becomes `error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dalle_dist import __version__
from dalle_dist.cli.check_cmd import add_check
from dalle_dist.cli.checkpoint_cmd import add_checkpoint
from dalle_dist.cli.doctor_cmd import add_doctor
from dalle_dist.cli.exits import exit_now
from dalle_dist.cli.generate_cmd import add_generate
from dalle_dist.cli.parser import ArgumentParser, given_dests, subcommand_parser
from dalle_dist.cli.plan_cmd import add_plan
from dalle_dist.cli.train_cmds import add_train, add_train_vae
from dalle_dist.errors import DalleDistError, Stopped


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="dalle-dist",
        description="Train and sample DALL-E style text-to-image models; the distributed "
                    "backend, precision and attention pattern are flags.")
    parser.add_argument("--version", action="version", version=f"dalle_dist {__version__}")
    # The deepspeed launcher passes --local_rank=N before the subcommand.
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int,
                        default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_train_vae(sub)
    add_train(sub)
    add_generate(sub)
    add_checkpoint(sub)
    add_check(sub)
    add_doctor(sub)
    add_plan(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
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
    if getattr(args, "joined_process_group", False):
        exit_now(status)
    return status
