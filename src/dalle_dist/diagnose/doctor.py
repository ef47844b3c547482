"""`dalle-dist doctor`: a failure log in; its root cause, the fix and a check out.

The knowledge is data (dalle_dist.diagnose.signatures); this module only reads a log
and picks among the signatures it matches:

1. Lines are matched after removing ANSI colours, making typographic punctuation plain
   (curly quotes, an en/em dash for an option's `--`, no-break spaces: what rich text
   turns a pasted log into), and removing what launchers, loggers and CI put
   before a line (`[rank0]:`, `[1,0]<stderr>:`, `<stderr>:`, timestamps, glog headers
   such as `E0213 12:07:20.086 42 api.py:874]`, DeepSpeed's `[<time>] [INFO] [f:l:fn]`,
   Python logging's `ERROR:name:`, quoting `> ` and backticks of pasted logs), so a
   signature keys on the engine's own wording only.
2. Each matching line gets a place score: 3 inside torchrun's "Root Cause (first observed
   failure)" section, 2 on an exception line (`SomethingError: ...`, the last line of a
   traceback) or an `error: ...` line, 1 anywhere else. Launchers repeat a failure as
   noise ("exits with return code", ChildFailedError, other ranks' NCCL timeouts); the
   line a failing rank raised, or the one torchrun names as first, is the telling one.
3. The failure with the highest place score wins; on a tie the signature listed first in
   SIGNATURES (root causes before their follow-on symptoms); then the earliest line.
   Catch-all entries (`fallback`, e.g. any NCCL error) decide only when no specific
   failure matched, whatever their place.
4. A line that several signatures match is harmless or a failure as the first of them
   in SIGNATURES says (Apex's fallback warning quotes an ImportError; the OVERFLOW line
   where the loss scale reaches its floor is a failure). Harmless lines never decide a
   log that holds a failure. A log with only harmless matches is category `benign`,
   unless it also holds an exception line nothing explains (then the run failed for a
   reason doctor does not know: `unknown`). A log with no match is `unknown`: doctor
   names no cause it has not recognised.
5. Sequence signatures (`scale_at_most`) read every line they match and apply only when
   the loss scale they capture falls to the floor: a collapsing scale, not warm-up.

`confidence` (0..1) says how clear the reading is: the place of the deciding line, lowered
when other failure categories match equally telling lines or when exception lines stay
unexplained; `alternatives` name up to two other categories with the line each rests on.
"""

from __future__ import annotations

import bisect
import itertools
import re
import re._constants as _constants  # the parsed form of a pattern, for its literal runs
import re._parser as _parser
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from dalle_dist.diagnose.signatures import BENIGN, SIGNATURES, UNKNOWN, Signature

MAX_MATCHES = 10
MAX_ALTERNATIVES = 2

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\n]*\x07")
# What launchers, loggers, CI and issue trackers put before a rank's own line; removed
# (repeatedly: prefixes stack, e.g. `[rank0]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] `)
# before matching. Every alternative ends in a separator, so no message text is eaten.
_PREFIX = re.compile(
    r"^(?:[ \t]*(?:"
    r"\[(?:rank|default)\d+\]:[ \t]?"                              # torchrun --tee
    r"|\[\d+(?:,\d+)?\]<std(?:out|err)>:[ \t]?"                    # horovodrun, mpirun
    r"|<std(?:out|err)>:[ \t]?"
    r"|\[\d{4}-\d\d-\d\d[ T][\d:,.]+\](?:[ \t]?\[[^\]\n]*\]){0,2}(?:[ \t]?-)?[ \t]?"  # DS
    # (level and file:line:func at most: DeepSpeed's own `[deepspeed] OVERFLOW!` stays)
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"(?:[ \t]+\|)?[ \t]+(?:-[ \t]+)?(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b[ \t:-]*)?"
    r"|\d\d/\d\d[ \t]\d\d:\d\d:\d\d[ \t]-[ \t][\w.]+[ \t]-[ \t][A-Z]+[ \t]-[ \t]"  # mmengine
    r"|\[?[IWEF]\d{4}[ \t][\d:.]+(?:[ \t]+\d+)?[ \t]+[\w./\\-]+:\d+\][ \t]?"        # glog
    r"|\[[IWEF][ \t][\w./\\-]+:\d+\][ \t]?"                        # [E socket.cpp:793]
    r"|\[c10d\][ \t]?"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:[ \t]?"        # Python logging
    r"|\[\d+\][ \t](?=\[rank)"                                     # pid before [rankN]
    r"|[\w.-]+:[ \t](?=\[rank\d+\])"                               # pdsh host before rank
    r"|\((?:\w+[ \t])?pid=\d+(?:,[ \t]ip=[\d.]+)?\)[ \t]"          # ray workers
    r"|>[ \t]?"                                                    # quoted in an issue
    r"|`+|\*\*"                                                    # markdown around lines
    r"))+", re.MULTILINE)
# Rich text (issue trackers, chat, word processors, macOS smart punctuation) rewrites what
# it pastes: quotes become curly, `--` before an option becomes an en or em dash, `...` an
# ellipsis, spaces no-break ones, and invisible zero-width characters slip in. Engines print
# plain ASCII, so the log is read with these turned back (see `normalise_punctuation`);
# what doctor quotes from the log stays as the log has it.
_PUNCTUATION: dict[str, str] = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2010": "-", "\u2011": "-", "\u2212": "-", "\u2026": "...",
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2007": " ", "\u2009": " ",
    "\u202f": " ", "\u3000": " ",
    "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "",
}
# (a substitution, not str.translate: translate reads a non-ASCII text character by
# character through the mapping, ~20x slower on a long log than scanning for these few)
_TYPOGRAPHIC = re.compile("[" + "".join(_PUNCTUATION) + "]")
# An en or em dash (or one next to a hyphen) that starts an option name: `–local_rank`,
# `—deepspeed`, `-–fp16`. Not after a word, a number or a path (`1–5`, `a–b`), and not
# before a space (a dash in prose); `_option_dash` looks at what comes before (the pattern
# starts with the dash itself, so a long log is scanned for it quickly).
_OPTION_DASH = re.compile(r"[\u2013\u2014]-?(?=[A-Za-z])")
_NOT_BEFORE_OPTION = re.compile(r"[\w.\-/\\\u2013\u2014]")
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
    order: int       # position of the signature in SIGNATURES
    signature: Signature
    groups: dict[str, str]


@dataclass(frozen=True)
class _Pattern:
    """A compiled pattern and the literal runs any match must contain (for the prefilter)."""

    regex: re.Pattern[str]
    literals: tuple[str, ...]   # lower-cased: the prefilter scans the lower-cased log


def _literal_runs(pattern: str) -> tuple[str, ...]:
    """Runs of plain characters (3 or more) that every match of `pattern` contains, read
    from the parsed pattern: top-level literals and plain groups, never inside
    alternatives, repeats or classes; lower-cased."""
    runs: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) >= 3:
            runs.append("".join(run).lower())
        run.clear()

    def walk(items: Any) -> None:
        for op, av in items:
            if op is _constants.LITERAL:
                run.append(chr(av))
            elif op is _constants.SUBPATTERN and \
                    not any(o is _constants.BRANCH for o, _ in av[3]):
                walk(av[3])
            elif op is not _constants.AT:
                flush()

    walk(list(_parser.parse(pattern)))
    flush()
    return tuple(runs)


@cache
def _patterns(order: int) -> tuple[tuple[_Pattern, ...], tuple[_Pattern, ...]]:
    """The signature's patterns and requires, compiled, with their literal runs."""
    def build(sources: tuple[str, ...]) -> tuple[_Pattern, ...]:
        return tuple(_Pattern(re.compile(p, re.MULTILINE), _literal_runs(p)) for p in sources)

    signature = SIGNATURES[order]
    return build(signature.patterns), build(signature.requires)


_DIGITS = str.maketrans("123456789", "000000000")
_DIGIT_BYTES = bytes.maketrans(b"123456789", b"000000000")


def _fold_digits(text: str) -> str:
    """`text` with the digits 1-9 as 0. A non-ASCII text (tqdm's block bars, other
    languages) goes through its UTF-8 bytes: str.translate would read it character by
    character through a mapping (seconds on a 200k-line log), and an ASCII digit's byte
    never occurs inside another character's UTF-8 sequence."""
    if text.isascii():
        return text.translate(_DIGITS)
    return text.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES).decode(
        "utf-8", "surrogatepass")


@cache
def _word_checks(literal: str) -> tuple[tuple[str, str], ...]:
    """What every text holding `literal` holds among its words (maximal runs of
    non-whitespace, as str.split() cuts them): each whitespace-free piece of the literal
    is a whole word ("=") when whitespace bounds it on both sides inside the literal, a
    word's start ("<") or end (">") when bounded on one side, part of a word ("~") else."""
    pieces = literal.split()
    left = bool(literal) and literal[0].isspace()
    right = bool(literal) and literal[-1].isspace()
    checks = []
    for i, piece in enumerate(pieces):
        bounded = (i > 0 or left, i < len(pieces) - 1 or right)
        kind = {(True, True): "=", (True, False): "<", (False, True): ">"}.get(bounded, "~")
        checks.append((kind, piece))
    # whole words first: a set lookup, cheaper than a scan of the word text
    return tuple(sorted(checks, key=lambda c: c[0] != "="))


class _Text:
    """Distinct lines joined into one text, for substring scans, and where each starts.

    A literal costs a scan of the whole text, and most literals are absent from a log.
    Before scanning, `may_hold` asks the log's distinct words (a far smaller text when
    lines differ only in a few words: ids, hashes) whether the literal's pieces occur in
    words as the literal needs them (`_word_checks`); a literal failing that is absent
    for sure, so the answer never changes, only the scans made."""

    def __init__(self, lines: list[str]) -> None:
        self.text = "\n".join(lines)
        self.starts = [0, *itertools.accumulate(len(line) + 1 for line in lines[:-1])]
        self._words: frozenset[str] | None = None
        self._word_text = ""   # "\n" + the distinct words, each followed by "\n"

    def may_hold(self, literal: str) -> bool:
        """False only when no line can hold `literal` (see the class docstring)."""
        if self._words is None:
            self._words = frozenset(self.text.split())
            self._word_text = "\n" + "\n".join(self._words) + "\n"
        words, text = self._words, self._word_text
        for kind, piece in _word_checks(literal):
            if kind == "=":
                present = piece in words
            elif kind == "<":
                present = "\n" + piece in text
            elif kind == ">":
                present = piece + "\n" in text
            else:
                present = piece in text
            if not present:
                return False
        return True

    def lines_with(self, literal: str, limit: int | None = None) -> list[int] | None:
        """The lines holding `literal`; None once more than `limit` lines hold it (the
        caller wants the rarest literal of a pattern and already has one that rare)."""
        if not self.may_hold(literal):
            return []
        text, starts, found, at = self.text, self.starts, [], 0
        while (at := text.find(literal, at)) >= 0:
            line = bisect.bisect_right(starts, at) - 1
            found.append(line)
            if limit is not None and len(found) > limit:
                return None
            at = starts[line + 1] if line + 1 < len(starts) else len(text)
        return found


class _Log:
    """A log read lazily by line. Its typographic punctuation is made plain first
    (`normalise_punctuation`), for the prefilter and the patterns alike; `raw_line` keeps
    the log's own text for quoting. Substring prefilters run on its distinct lines with
    digits folded to 0 (a long run repeats the same step, timer and NCCL INFO lines with
    other numbers), and a line is cleaned of its prefixes and matched against a pattern
    only when it holds the pattern's rarest literal run."""

    def __init__(self, text: str) -> None:
        raw = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
        self.raw = raw.split("\n")   # what doctor quotes: the log's own lines
        plain = normalise_punctuation(raw)
        # what patterns and the prefilter read: the same lines, punctuation made plain
        self.plain = self.raw if plain is raw else plain.split("\n")
        assert len(self.plain) == len(self.raw)
        self._members: dict[str, list[int]] = {}
        for i, line in enumerate(_fold_digits(plain).split("\n")):
            self._members.setdefault(line, []).append(i)
        self._distinct = list(self._members.values())   # indexes of each distinct line
        self._text: _Text | None = None
        self._clean: dict[int, str] = {}
        self._found: dict[str, list[int]] = {}
        self._more_than: dict[str, int] = {}   # literal: on more distinct lines than this

    @property
    def lines(self) -> int:
        return len(self.raw)

    def raw_line(self, i: int) -> str:
        return self.raw[i]

    def clean_line(self, i: int) -> str:
        if i not in self._clean:
            self._clean[i] = _PREFIX.sub("", self.plain[i], count=1)
        return self._clean[i]

    def _text_of_lines(self) -> _Text:
        if self._text is None:
            self._text = _Text([line.lower() for line in self._members])
        return self._text

    def _distinct_with(self, literal: str, limit: int | None = None) -> list[int] | None:
        """The distinct lines holding `literal` (lower-cased), whatever their case; None
        when more than `limit` of them do (remembered, so the scan is not repeated for
        the same or a lower limit)."""
        if literal in self._found:
            return self._found[literal]
        if limit is not None and self._more_than.get(literal, -1) >= limit:
            return None
        found = self._text_of_lines().lines_with(literal.translate(_DIGITS), limit)
        if found is None:
            assert limit is not None  # an unlimited scan always returns its lines
            self._more_than[literal] = limit
        else:
            self._found[literal] = found
        return found

    def candidates(self, pattern: _Pattern) -> list[int]:
        """Lines that can hold a match: those holding the pattern's rarest literal run
        (every line when the pattern has none; none when one of its runs is absent).
        Runs that the log's words rule out are looked at first, without a scan; a scan
        stops once its run is on more lines than the rarest found so far."""
        if not pattern.literals:
            return list(range(self.lines))
        literals = sorted(pattern.literals, key=len, reverse=True)  # longest: rarest
        text = self._text_of_lines()
        if not all(text.may_hold(literal.translate(_DIGITS)) for literal in literals):
            return []  # one literal absent: the pattern cannot match; no scans
        rarest: list[int] | None = None
        for literal in literals:
            found = self._distinct_with(literal, None if rarest is None else len(rarest))
            if found is None:
                continue  # on more lines than the rarest so far
            if not found:
                return []  # one literal absent: the pattern cannot match; no more scans
            if rarest is None or len(found) < len(rarest):
                rarest = found
        return sorted(i for d in rarest or () for i in self._distinct[d])

    def search(self, pattern: _Pattern) -> Iterator[tuple[int, re.Match[str]]]:
        for line in self.candidates(pattern):
            m = pattern.regex.search(self.clean_line(line))
            if m:
                yield line, m

    def lines_with(self, words: tuple[str, ...]) -> list[int]:
        found: set[int] = set()
        for word in words:
            found.update(self.candidates(_Pattern(re.compile(re.escape(word)), (word.lower(),))))
        return sorted(found)


def normalise_punctuation(text: str) -> str:
    """`text` with the typographic punctuation rich text pastes turned back into what the
    engines print: curly quotes straight, an en/em dash starting an option name `--`, an
    ellipsis `...`, no-break and other wide spaces plain spaces, zero-width characters
    gone. Never adds or removes a line break, so line numbers stay those of the log; an
    ASCII text is returned as it is (no copy)."""
    if text.isascii():
        return text
    if "\u2013" in text or "\u2014" in text:
        text = _OPTION_DASH.sub(_option_dash, text)
    return _TYPOGRAPHIC.sub(lambda m: _PUNCTUATION[m.group()], text)


def _option_dash(m: re.Match[str]) -> str:
    """`--` for a dash that starts an option name (`-` after a hyphen already there: the
    two are the option's dashes), the dash as it is elsewhere."""
    text, at = m.string, m.start()
    before = text[at - 1] if at else " "
    if before == "-":
        before, dashes = (text[at - 2] if at > 1 else " "), "-"
    else:
        dashes = "--"
    return m.group() if _NOT_BEFORE_OPTION.match(before) else dashes


def _fill(template: str, groups: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: groups.get(m.group(1), m.group(0)), template)


def _root_cause_lines(log: _Log) -> set[int]:
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


def _find_hits(log: _Log) -> list[_Hit]:
    hits = []
    for order, signature in enumerate(SIGNATURES):
        patterns, requires = _patterns(order)
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


def _matches(hits: list[_Hit], best: _Hit | None, log: _Log) -> tuple[Match, ...]:
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


def _unexplained_exceptions(log: _Log, explained: set[int]) -> list[int]:
    """Exception lines (the last line of a traceback) that no signature matched, launcher
    wrappers aside: evidence of a failure doctor does not know."""
    return [i for i in log.lines_with(("Error", "Exception", "Exit", "Interrupt"))
            if i not in explained and _EXCEPTION_LINE.match(log.clean_line(i))
            and not _WRAPPER.search(log.clean_line(i))]


_PLACE_CONFIDENCE = {3: 0.95, 2: 0.9, 1: 0.75}


def diagnose(text: str) -> Diagnosis:
    """The most likely root cause of the failure this log shows (see the module docstring)."""
    log = _Log(text)
    root = _root_cause_lines(log)

    def place(line: int) -> int:
        if line in root:
            return 3
        clean = log.clean_line(line)
        return 2 if _EXCEPTION_LINE.match(clean) or _ERROR_LINE.match(clean) else 1

    hits = _find_hits(log)
    # A line is harmless or a failure as the first signature (in SIGNATURES) matching it says.
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
