"""`dalle-dist selftest`: the acceptance run of a machine, from the installed package.

What `accelerate test` is to accelerate: a user who pip-installed dalle-dist proves
that this machine trains every backend in every precision, resumes a preempted run
exactly, and samples correctly, without a clone of the repository (the checks and why
each exists: dalle_dist.selftest). Exit status: 0 when no check failed, 1 when one did,
2 when the device asked for is not there.

torch is imported only when the command runs, so `dalle-dist selftest --help` stays fast.
"""

from __future__ import annotations

import argparse

from dalle_dist.config_base import add_flags, from_args
from dalle_dist.selftest.config import SelftestConfig


def add_selftest(p: argparse.ArgumentParser) -> None:
    p.description = ("Train each backend (single, DeepSpeed ZeRO-2/3, FSDP; world size 1, "
                     "each under its own launcher) in each precision, stop a run with "
                     "SIGTERM and resume it, check every attention path against the dense "
                     "reference and the fast sampling paths against plain decoding; with 2 or more "
                     "GPUs (or --ranks N) also N ranks of each distributed backend against "
                     "one process, and a hung rank against the watchdog. Prints "
                     "one line per check (PASS, FAIL, or why it did not run here) and "
                     "exits 1 when any check fails; it is sized to end within minutes "
                     "on one GPU.")
    add_flags(p, SelftestConfig)
    p.set_defaults(run=run_selftest_cmd)


def run_selftest_cmd(args: argparse.Namespace) -> int:
    from dalle_dist.selftest import run_selftest

    config = from_args(SelftestConfig, args)
    return run_selftest(config.device, config.quick, config.out, ranks=config.ranks)
