"""`dalle-dist doctor`: a failure log in; its root cause, the fix and a check out.

The knowledge is data (dalle_dist.diagnose.signatures); this module only reads a log
and picks among the signatures it matches:

1. Lines are matched after removing ANSI colours and rank/logger prefixes
   (`[rank0]:`, `[1,0]<stderr>:`, DeepSpeed's `[<time>] [INFO] [file:line:func]`).
2. Each matching line gets a place score: 3 inside torchrun's "Root Cause (first observed
   failure)" section, 2 on an exception line (`SomethingError: ...`, the last line of a
   traceback) or an `error: ...` line, 1 anywhere else. Launchers repeat a failure as
   noise ("exits with return code", ChildFailedError, other ranks' NCCL timeouts); the
   line a failing rank raised, or the one torchrun names as first, is the telling one.
3. The failure with the highest place score wins; on a tie the signature listed first in
   SIGNATURES (root causes before their follow-on symptoms); then the earliest line.
4. A line that several signatures match is harmless or a failure as the first of them
   in SIGNATURES says (Apex's fallback warning quotes an ImportError; DeepSpeed's last
   OVERFLOW line before the minimum scale is a failure). Harmless lines never decide a
   log that holds a failure; a log with only harmless matches is category `benign`, and
   a log with no match is `unknown`: doctor names no cause it has not recognised.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from dalle_dist.diagnose.signatures import BENIGN, SIGNATURES, UNKNOWN, Signature

MAX_MATCHES = 10

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# What launchers and loggers put before a rank's own line; removed before matching.
_PREFIX = re.compile(
    r"^(?:\[(?:rank|default)\d+\]:[ \t]?"                          # torchrun --tee, torch >= 2.2
    r"|\[\d+(?:,\d+)?\]<std(?:out|err)>:[ \t]?"                    # horovodrun, mpirun
    r"|\[\d{4}-\d\d-\d\d [\d:,.]+\] \[[A-Z]+\] \[[^\]\n]*\][ \t]?"  # DeepSpeed's logger
    r")+", re.MULTILINE)
_ROOT_CAUSE = re.compile(r"^.*Root Cause \(first observed failure\):", re.MULTILINE)
_BORDER = re.compile(r"^=+[ \t]*$", re.MULTILINE)
_EXCEPTION_LINE = re.compile(
    r"^\s*(?:[A-Za-z_]\w*\.)*(?:\w+(?:Error|Exception|Exit|Interrupt)|Exception)(?::|$)")
_ERROR_LINE = re.compile(r"^(?:[\w.\-]+(?: [\w\-]+)?: )?error: ")


@dataclass(frozen=True)
class Match:
    """A log line that matched: its 1-based number and its text as the log has it."""

    line: int
    text: str


@dataclass(frozen=True)
class Diagnosis:
    category: str
    cause: str
    fix: str
    check: str
    matches: tuple[Match, ...] = ()
    benign: tuple[str, ...] = ()   # notes on harmless warnings seen in the log
    signature: str | None = None   # the id of the deciding signature

    def to_json(self) -> dict[str, Any]:
        """The `--json` object, exactly the issue's five keys (harmless-warning notes are
        in the human output; a log of only harmless warnings is category `benign`)."""
        return {"category": self.category, "cause": self.cause, "fix": self.fix,
                "check": self.check, "matches": [m.text for m in self.matches]}


@dataclass(frozen=True)
class _Hit:
    line: int        # 0-based
    order: int       # position of the signature in SIGNATURES
    signature: Signature
    groups: dict[str, str]


@cache
def _compiled(order: int) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.MULTILINE) for p in SIGNATURES[order].patterns)


@cache
def _required(order: int) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.MULTILINE) for p in SIGNATURES[order].requires)


def _fill(template: str, groups: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: groups.get(m.group(1), m.group(0)), template)


def _root_cause_lines(clean: str, starts: list[int]) -> set[int]:
    """Line indexes inside torchrun's "Root Cause (first observed failure)" sections."""
    lines: set[int] = set()
    for header in _ROOT_CAUSE.finditer(clean):
        border = _BORDER.search(clean, header.end())
        end = border.start() if border else len(clean)
        first = bisect.bisect_right(starts, header.start()) - 1
        last = bisect.bisect_right(starts, max(end - 1, header.start())) - 1
        lines.update(range(first, last + 1))
    return lines


def _find_hits(clean: str, starts: list[int]) -> list[_Hit]:
    hits = []
    for order, signature in enumerate(SIGNATURES):
        if signature.requires and not any(r.search(clean) for r in _required(order)):
            continue
        found: dict[int, dict[str, str]] = {}
        for pattern in _compiled(order):
            for m in pattern.finditer(clean):
                line = bisect.bisect_right(starts, m.start()) - 1
                if line not in found:  # the first pattern that matches a line names groups
                    found[line] = {k: v for k, v in m.groupdict().items() if v is not None}
        hits.extend(_Hit(line, order, signature, groups) for line, groups in found.items())
    return hits


def _matches(hits: list[_Hit], best: _Hit | None, raw_lines: list[str]) -> tuple[Match, ...]:
    """The matched lines in log order, one per distinct text, the deciding one always kept."""
    chosen: dict[str, int] = {}
    if best is not None:
        chosen[raw_lines[best.line].strip()] = best.line
    for hit in sorted(hits, key=lambda h: h.line):
        text = raw_lines[hit.line].strip()
        if len(chosen) >= MAX_MATCHES:
            break
        chosen.setdefault(text, hit.line)
    return tuple(Match(line + 1, text) for text, line in sorted(chosen.items(),
                                                                key=lambda kv: kv[1]))


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def diagnose(text: str) -> Diagnosis:
    """The most likely root cause of the failure this log shows (see the module docstring)."""
    raw = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    clean = _PREFIX.sub("", raw)  # same lines as raw: the prefixes hold no newline
    raw_lines, clean_lines = raw.split("\n"), clean.split("\n")
    starts = [0, *(m.end() for m in re.finditer("\n", clean))]
    root = _root_cause_lines(clean, starts)

    def place(line: int) -> int:
        if line in root:
            return 3
        text = clean_lines[line]
        return 2 if _EXCEPTION_LINE.match(text) or _ERROR_LINE.match(text) else 1

    hits = _find_hits(clean, starts)
    # A line is harmless or a failure as the first signature (in SIGNATURES) matching it says.
    first: dict[int, _Hit] = {}
    for hit in hits:
        if hit.line not in first or hit.order < first[hit.line].order:
            first[hit.line] = hit
    failures = [h for h in hits if not h.signature.benign and not first[h.line].signature.benign]
    harmless = [h for h in hits if h.signature.benign and first[h.line].signature.benign]
    notes = _unique([h.signature.cause for h in sorted(harmless, key=lambda h: h.order)])

    if failures:
        best = max(failures, key=lambda h: (place(h.line), -h.order, -h.line))
        signature = best.signature
        same = [h for h in failures if h.signature.category == signature.category]
        return Diagnosis(
            category=signature.category, cause=_fill(signature.cause, best.groups),
            fix=_fill(signature.fix, best.groups), check=_fill(signature.check, best.groups),
            matches=_matches(same, best, raw_lines), benign=notes, signature=signature.id)
    if harmless:
        lead = min(harmless, key=lambda h: (h.order, h.line)).signature
        return Diagnosis(
            category=BENIGN,
            cause="only harmless warnings, no failure: " + "; ".join(notes),
            fix="nothing to fix for these; if the run did fail, its error is not in this log",
            check=lead.check, matches=_matches(harmless, None, raw_lines), benign=notes,
            signature=lead.id)
    return Diagnosis(
        category=UNKNOWN,
        cause=f"none of the {sum(not s.benign for s in SIGNATURES)} known failure "
              "signatures matches this log",
        fix="read the first error of the first rank that failed (torchrun's Root Cause, or "
            "the earliest traceback); dalle-dist check shows what this machine can run",
        check="dalle-dist check")
