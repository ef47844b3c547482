"""`dalle-dist doctor`: a failure log in; its root cause, the fix and a check out.

The knowledge is data (dalle_dist.doctor.signatures); this module only picks among the
signatures a log matches (dalle_dist.doctor.log reads the log: cleaned lines, prefilter):

1. Each matching line gets a place score: 3 inside torchrun's "Root Cause (first observed
   failure)" section, 2 on an exception line (`SomethingError: ...`, the last line of a
   traceback) or an `error: ...` line, 1 anywhere else. Launchers repeat a failure as
   noise ("exits with return code", ChildFailedError, other ranks' NCCL timeouts); the
   line a failing rank raised, or the one torchrun names as first, is the telling one.
2. The failure with the highest place score wins; on a tie the signature of lowest
   `priority` (root causes before their follow-on symptoms); then the earliest line.
   Catch-all entries (`fallback`, e.g. any NCCL error) decide only when no specific
   failure matched, whatever their place.
3. A line that several signatures match is harmless or a failure as the one of lowest
   priority says (Apex's fallback warning quotes an ImportError; the OVERFLOW line where
   the loss scale reaches its floor is a failure). Harmless lines never decide a log that
   holds a failure. A log with only harmless matches is category `benign`, unless it also
   holds an exception line nothing explains (then the run failed for a reason doctor does
   not know: `unknown`). A log with no match is `unknown`: doctor names no cause it has
   not recognised.
4. Sequence signatures (`scale_at_most`) read every line they match and apply only when
   the loss scale they capture falls to the floor: a collapsing scale, not warm-up.

`confidence` (0..1) says how clear the reading is: the place of the deciding line, lowered
when other failure categories match equally telling lines or when exception lines stay
unexplained; `alternatives` name up to two other categories with the line each rests on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from dalle_dist.doctor.log import Log
from dalle_dist.doctor.prefilter import Pattern, literal_runs
from dalle_dist.doctor.signatures import BENIGN, SIGNATURES, UNKNOWN, Signature

MAX_MATCHES = 10
MAX_ALTERNATIVES = 2

_BORDER = re.compile(r"^=+[ \t]*$")
_EXCEPTION_LINE = re.compile(
    r"^\s*(?:[A-Za-z_]\w*\.)*(?:\w+(?:Error|Exception|Exit|Interrupt)|Exception)(?::|$)")
_ERROR_LINE = re.compile(r"^(?:[\w.\-]+(?: [\w\-]+)?: )?error: ")
# Launchers' own wrappers around a rank's failure: never the cause themselves.
_WRAPPER = re.compile(r"ChildFailedError|ProcessRaisedException|CalledProcessError|"
                      r"SystemExit|KeyboardInterrupt")


@dataclass(frozen=True)
class Match:
    """A log line that matched: its 1-based number and its text as the log has it."""

    line: int
    text: str


@dataclass(frozen=True)
class Alternative:
    """Another category the log also matched, and the line that reading rests on."""

    category: str
    line: str


@dataclass(frozen=True)
class Diagnosis:
    category: str
    cause: str
    fix: str
    check: str
    matches: tuple[Match, ...] = ()
    benign: tuple[str, ...] = ()   # notes on harmless warnings seen in the log
    signature: str | None = None   # the id of the deciding signature
    confidence: float = 0.0        # 0..1; 0 for unknown
    alternatives: tuple[Alternative, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The `--json` object: the issue's five keys, then `confidence` and up to two
        `alternatives` ({category, line}). Harmless-warning notes are in the human
        output; a log of only harmless warnings is category `benign`."""
        return {"category": self.category, "cause": self.cause, "fix": self.fix,
                "check": self.check, "matches": [m.text for m in self.matches],
                "confidence": self.confidence,
                "alternatives": [{"category": a.category, "line": a.line}
                                 for a in self.alternatives]}


@dataclass(frozen=True)
class _Hit:
    line: int        # 0-based
    order: int       # position of the signature in SIGNATURES (by priority)
    signature: Signature
    groups: dict[str, str]


@cache
def signature_patterns(order: int) -> tuple[tuple[Pattern, ...], tuple[Pattern, ...]]:
    """The signature's patterns and requires, compiled, with their literal runs."""
    def build(sources: tuple[str, ...]) -> tuple[Pattern, ...]:
        return tuple(Pattern(re.compile(p, re.MULTILINE), literal_runs(p)) for p in sources)

    signature = SIGNATURES[order]
    return build(signature.patterns), build(signature.requires)


def _fill(template: str, groups: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: groups.get(m.group(1), m.group(0)), template)


def _root_cause_lines(log: Log) -> set[int]:
    """Line indexes inside torchrun's "Root Cause (first observed failure)" sections."""
    lines: set[int] = set()
    for header in log.lines_with(("Root Cause (first observed failure):",)):
        line = header + 1
        while line < log.lines and not _BORDER.match(log.clean_line(line)):
            line += 1
        lines.update(range(header, min(line, log.lines)))
    return lines


def _as_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")


def _find_hits(log: Log) -> list[_Hit]:
    hits = []
    for order, signature in enumerate(SIGNATURES):
        patterns, requires = signature_patterns(order)
        if requires and not any(next(log.search(r), None) for r in requires):
            continue
        found: dict[int, dict[str, str]] = {}
        for pattern in patterns:
            for line, m in log.search(pattern):
                groups = {k: v for k, v in m.groupdict().items() if v is not None}
                if signature.scale_at_most is not None and \
                        _as_float(groups.get("scale", "inf")) > signature.scale_at_most:
                    continue  # a sequence applies from the line the scale hits the floor
                if line not in found:  # the first pattern that matches a line names groups
                    found[line] = groups
        if signature.scale_at_most is not None and found:
            first = min(found)  # the sequence decides on the first line at the floor
            found = {first: found[first]}
        hits.extend(_Hit(line, order, signature, groups) for line, groups in found.items())
    return hits


def _matches(hits: list[_Hit], best: _Hit | None, log: Log) -> tuple[Match, ...]:
    """The matched lines in log order, one per distinct text, the deciding one always kept."""
    chosen: dict[str, int] = {}
    if best is not None:
        chosen[log.raw_line(best.line).strip()] = best.line
    for hit in sorted(hits, key=lambda h: h.line):
        text = log.raw_line(hit.line).strip()
        if len(chosen) >= MAX_MATCHES:
            break
        chosen.setdefault(text, hit.line)
    return tuple(Match(line + 1, text) for text, line in sorted(chosen.items(),
                                                                key=lambda kv: kv[1]))


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _unexplained_exceptions(log: Log, explained: set[int]) -> list[int]:
    """Exception lines (the last line of a traceback) that no signature matched, launcher
    wrappers aside: evidence of a failure doctor does not know."""
    return [i for i in log.lines_with(("Error", "Exception", "Exit", "Interrupt"))
            if i not in explained and _EXCEPTION_LINE.match(log.clean_line(i))
            and not _WRAPPER.search(log.clean_line(i))]


_PLACE_CONFIDENCE = {3: 0.95, 2: 0.9, 1: 0.75}


def diagnose(text: str) -> Diagnosis:
    """The most likely root cause of the failure this log shows (see the module docstring)."""
    log = Log(text)
    root = _root_cause_lines(log)

    def place(line: int) -> int:
        if line in root:
            return 3
        clean = log.clean_line(line)
        return 2 if _EXCEPTION_LINE.match(clean) or _ERROR_LINE.match(clean) else 1

    hits = _find_hits(log)
    # A line is harmless or a failure as the matching signature of lowest priority says.
    first: dict[int, _Hit] = {}
    for hit in hits:
        if hit.line not in first or hit.order < first[hit.line].order:
            first[hit.line] = hit
    failures = [h for h in hits if not h.signature.benign and not first[h.line].signature.benign]
    harmless = [h for h in hits if h.signature.benign and first[h.line].signature.benign]
    notes = _unique([h.signature.cause for h in sorted(harmless, key=lambda h: h.order)])
    unexplained = _unexplained_exceptions(log, {h.line for h in hits})

    if failures:
        def rank(h: _Hit) -> tuple[bool, int, int, int]:
            # Catch-all entries decide only when no specific failure matched.
            return not h.signature.fallback, place(h.line), -h.order, -h.line

        best = max(failures, key=rank)
        signature = best.signature
        same = [h for h in failures if h.signature.category == signature.category]
        # The best line of every other category, most telling first.
        others: dict[str, _Hit] = {}
        for hit in sorted(failures, key=rank, reverse=True):
            # A line another signature claims first is that signature's reading only.
            if hit.signature.category != signature.category and first[hit.line] is hit:
                others.setdefault(hit.signature.category, hit)
        alternatives = tuple(Alternative(h.signature.category, log.raw_line(h.line).strip())
                             for h in list(others.values())[:MAX_ALTERNATIVES])
        confidence = _PLACE_CONFIDENCE[place(best.line)]
        if any(place(h.line) >= place(best.line) for h in others.values()):
            confidence *= 0.7   # another category is as telling: a close call
        elif others:
            confidence *= 0.9
        if place(best.line) < 2 and any(i > best.line for i in unexplained):
            confidence *= 0.75  # the run later raised something no signature explains
        if signature.fallback:
            confidence *= 0.8   # only a catch-all matched
        return Diagnosis(
            category=signature.category, cause=_fill(signature.cause, best.groups),
            fix=_fill(signature.fix, best.groups), check=_fill(signature.check, best.groups),
            matches=_matches(same, best, log), benign=notes, signature=signature.id,
            confidence=round(confidence, 2), alternatives=alternatives)
    if harmless and not unexplained:
        lead = min(harmless, key=lambda h: (h.order, h.line)).signature
        return Diagnosis(
            category=BENIGN,
            cause="only harmless warnings, no failure: " + "; ".join(notes),
            fix="nothing to fix for these; if the run did fail, its error is not in this log",
            check=lead.check, matches=_matches(harmless, None, log), benign=notes,
            signature=lead.id, confidence=0.6)
    cause = (f"none of the {sum(not s.benign for s in SIGNATURES)} known failure "
             "signatures matches this log")
    if unexplained:
        cause += f" (its error is: {log.clean_line(unexplained[-1]).strip()[:160]})"
    return Diagnosis(
        category=UNKNOWN, cause=cause,
        fix="read the first error of the first rank that failed (torchrun's Root Cause, or "
            "the earliest traceback); dalle-dist check shows what this machine can run",
        check="dalle-dist check", benign=notes)
