"""Which lines of a log a pattern is tried on: its literal runs, looked up cheaply first.

A pattern can match only a line holding every run of plain characters it requires
(`literal_runs`). Lines are compared with their digits folded to 0 (a long run repeats the
same step, timer and NCCL INFO lines with other numbers), a literal is first checked
against the log's distinct words (`word_checks`), and only then is the text scanned for it
(`Text`). None of this changes what a pattern finds, only how many lines it is tried on
(tests/diagnose/test_doctor_prefilter.py compares it with a plain search of every line).
"""

from __future__ import annotations

import bisect
import itertools
import re
import re._constants as _constants  # the parsed form of a pattern, for its literal runs
import re._parser as _parser
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Pattern:
    """A compiled pattern and the literal runs any match must contain (for the prefilter)."""

    regex: re.Pattern[str]
    literals: tuple[str, ...]   # lower-cased: the prefilter scans the lower-cased log


def literal_runs(pattern: str) -> tuple[str, ...]:
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



DIGITS = str.maketrans("123456789", "000000000")
_DIGIT_BYTES = bytes.maketrans(b"123456789", b"000000000")


def fold_digits(text: str) -> str:
    """`text` with the digits 1-9 as 0. A non-ASCII text (tqdm's block bars, other
    languages) goes through its UTF-8 bytes: str.translate would read it character by
    character through a mapping (slow on a long log: docs/benchmarks.md), and an ASCII
    digit's byte never occurs inside another character's UTF-8 sequence."""
    if text.isascii():
        return text.translate(DIGITS)
    return text.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES).decode(
        "utf-8", "surrogatepass")


@cache
def word_checks(literal: str) -> tuple[tuple[str, str], ...]:
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


class Text:
    """Distinct lines joined into one text, for substring scans, and where each starts.

    A literal costs a scan of the whole text, and most literals are absent from a log.
    Before scanning, `may_hold` asks the log's distinct words (a far smaller text when
    lines differ only in a few words: ids, hashes) whether the literal's pieces occur in
    words as the literal needs them (`word_checks`); a literal failing that is absent
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
        for kind, piece in word_checks(literal):
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

