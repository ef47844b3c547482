"""Where the suite's time goes: every run ends with its wall time, the slowest test files
and the slowest fixtures, from pytest's own per-phase durations.

A file's time is the sum of its tests' setup, call and teardown; a fixture's is the time
its set-up took, charged once to the test that first needed it (a session fixture's cost
shows once, not hidden in whichever test happened to run first). Under pytest-xdist the
workers' phases overlap: the sums then add up to more than the wall time, and the line
says how many workers shared it.

A file's CPU time counts the test process and every process it started and waited for
(the CLI runs, the launchers and their ranks): on two cores, CPU is what the suite's wall
time is made of once both workers are busy, and a neighbour's load does not inflate it.

`--timing-json PATH` writes every file's and fixture's seconds, for a before/after table
(`python -m tests.timing BEFORE.json AFTER.json` prints one). No test asserts on time:
the figures are for reading in every CI log.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

#: How many of the slowest files and fixtures the summary lists.
SHOWN = 10
_PROPERTY = "fixture_setup_s"
_CPU_PROPERTY = "cpu_s"


def cpu_seconds() -> float:
    """User + system time of this process and of its finished, waited-for children."""
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                      resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class SuiteClock:
    """Collects the durations reported for each test phase (on the controller under xdist,
    where the workers' reports arrive) and the fixture set-up times that came with them."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.files: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.fixtures: dict[str, float] = defaultdict(float)
        self.tests = 0
        self.workers: set[str] = set()

    def add(self, report: pytest.TestReport) -> None:
        self.files[report.nodeid.split("::", 1)[0]] += report.duration
        if report.when == "call":
            self.tests += 1
        gateway = getattr(getattr(report, "node", None), "gateway", None)  # an xdist worker's
        if gateway is not None:
            self.workers.add(gateway.id)
        for name, value in report.user_properties:
            if name == _PROPERTY:
                for fixture, seconds in value.items():
                    self.fixtures[fixture] += seconds
            elif name == _CPU_PROPERTY:
                self.cpu[report.nodeid.split("::", 1)[0]] += value

    def as_dict(self) -> dict[str, Any]:
        return {"wall_s": round(time.monotonic() - self.started, 1), "tests": self.tests,
                "workers": max(len(self.workers), 1),
                "files": {k: round(v, 2) for k, v in sorted(self.files.items())},
                "cpu": {k: round(v, 2) for k, v in sorted(self.cpu.items())},
                "fixtures": {k: round(v, 2) for k, v in sorted(self.fixtures.items())}}


_clock = SuiteClock()
#: Fixture set-ups finished in this process since the last report was made.
_pending: dict[str, float] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timing-json", metavar="PATH",
                     help="write the seconds spent per test file and per fixture to PATH")


def pytest_sessionstart(session: pytest.Session) -> None:
    _clock.started = time.monotonic()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any],
                         request: pytest.FixtureRequest) -> Generator[None, Any, Any]:
    """Times one fixture's own set-up (the fixtures it needs are set up before this hook)."""
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        # (a fixture set up again, parametrized or narrowly scoped, adds up)
        name = f"{fixturedef.argname} ({fixturedef.scope})"
        _pending[name] = _pending.get(name, 0.0) + time.perf_counter() - started


_phase_cpu = [0.0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    _phase_cpu[0] = cpu_seconds()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # (user_properties travel with the report from an xdist worker to the controller)
    now = cpu_seconds()
    report.user_properties.append((_CPU_PROPERTY, now - _phase_cpu[0]))
    _phase_cpu[0] = now
    if _pending and call.when == "setup":
        report.user_properties.append((_PROPERTY, dict(_pending)))
        _pending.clear()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller, or no xdist
        _clock.add(report)


def _table(rows: dict[str, float], title: str) -> list[str]:
    lines = [title]
    for name, seconds in sorted(rows.items(), key=lambda kv: -kv[1])[:SHOWN]:
        lines.append(f"{seconds:8.1f} s  {name}")
    return lines


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is not None or not _clock.files:
        return
    summary = _clock.as_dict()
    workers = summary["workers"]
    shared = f", {workers} workers side by side" if workers > 1 else ""
    total, cpu = sum(_clock.files.values()), sum(_clock.cpu.values())
    terminalreporter.write_sep("=", "where the time went")
    lines = [f"suite wall time {summary['wall_s'] / 60:.1f} min ({summary['wall_s']:.0f} s) "
             f"for {summary['tests']} tests; test time summed over files {total:.0f} s"
             f"{shared}; CPU time {cpu:.0f} s",
             *_table(_clock.files, f"the {SHOWN} slowest files (setup + call + teardown):"),
             *_table(_clock.cpu, f"the {SHOWN} files that took the most CPU time "
                     "(with the processes they started):"),
             *_table(_clock.fixtures, f"the {SHOWN} slowest fixture set-ups:")]
    for line in lines:
        terminalreporter.write_line(line)
    path = config.getoption("--timing-json")
    if path:
        Path(path).write_text(json.dumps(summary, indent=1) + "\n")


def compare(before: dict[str, Any], after: dict[str, Any], key: str = "files") -> str:
    """A markdown table of two --timing-json files' seconds per file (or per fixture, or
    CPU seconds per file), the biggest first."""
    old, new = before.get(key, {}), after.get(key, {})
    names = sorted(set(old) | set(new), key=lambda n: -max(old.get(n, 0.0), new.get(n, 0.0)))
    rows = [f"| {key} | before s | after s |", "| --- | --- | --- |"]
    for name in names:
        rows.append(f"| {name} | {old.get(name, 0.0):.1f} | {new.get(name, 0.0):.1f} |")
    rows.append(f"| wall time | {before['wall_s']:.0f} | {after['wall_s']:.0f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tests.timing BEFORE.json AFTER.json")
    old, new = (json.loads(Path(p).read_text()) for p in sys.argv[1:])
    print("\n\n".join(compare(old, new, key) for key in ("files", "cpu", "fixtures")))
