"""A log as doctor reads it: its own lines for quoting, cleaned lines for matching, and
a search that tries a pattern only on the lines the prefilter leaves."""

from __future__ import annotations

import re
from collections.abc import Iterator

from dalle_dist.doctor.cleaning import ANSI, PREFIX, normalise_punctuation
from dalle_dist.doctor.prefilter import DIGITS, Pattern, Text, fold_digits


class Log:
    """A log read lazily by line. Its typographic punctuation is made plain first
    (`normalise_punctuation`), for the prefilter and the patterns alike; `raw_line` keeps
    the log's own text for quoting. Substring prefilters run on its distinct lines with
    digits folded to 0 (a long run repeats the same step, timer and NCCL INFO lines with
    other numbers), and a line is cleaned of its prefixes and matched against a pattern
    only when it holds the pattern's rarest literal run."""

    def __init__(self, text: str) -> None:
        raw = ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
        self.raw = raw.split("\n")   # what doctor quotes: the log's own lines
        plain = normalise_punctuation(raw)
        # what patterns and the prefilter read: the same lines, punctuation made plain
        self.plain = self.raw if plain is raw else plain.split("\n")
        assert len(self.plain) == len(self.raw)
        self._members: dict[str, list[int]] = {}
        for i, line in enumerate(fold_digits(plain).split("\n")):
            self._members.setdefault(line, []).append(i)
        self._distinct = list(self._members.values())   # indexes of each distinct line
        self._text: Text | None = None
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
            self._clean[i] = PREFIX.sub("", self.plain[i], count=1)
        return self._clean[i]

    def _text_of_lines(self) -> Text:
        if self._text is None:
            self._text = Text([line.lower() for line in self._members])
        return self._text

    def _distinct_with(self, literal: str, limit: int | None = None) -> list[int] | None:
        """The distinct lines holding `literal` (lower-cased), whatever their case; None
        when more than `limit` of them do (remembered, so the scan is not repeated for
        the same or a lower limit)."""
        if literal in self._found:
            return self._found[literal]
        if limit is not None and self._more_than.get(literal, -1) >= limit:
            return None
        found = self._text_of_lines().lines_with(literal.translate(DIGITS), limit)
        if found is None:
            assert limit is not None  # an unlimited scan always returns its lines
            self._more_than[literal] = limit
        else:
            self._found[literal] = found
        return found

    def candidates(self, pattern: Pattern) -> list[int]:
        """Lines that can hold a match: those holding the pattern's rarest literal run
        (every line when the pattern has none; none when one of its runs is absent).
        Runs that the log's words rule out are looked at first, without a scan; a scan
        stops once its run is on more lines than the rarest found so far."""
        if not pattern.literals:
            return list(range(self.lines))
        literals = sorted(pattern.literals, key=len, reverse=True)  # longest: rarest
        text = self._text_of_lines()
        if not all(text.may_hold(literal.translate(DIGITS)) for literal in literals):
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

    def search(self, pattern: Pattern) -> Iterator[tuple[int, re.Match[str]]]:
        for line in self.candidates(pattern):
            m = pattern.regex.search(self.clean_line(line))
            if m:
                yield line, m

    def lines_with(self, words: tuple[str, ...]) -> list[int]:
        found: set[int] = set()
        for word in words:
            found.update(self.candidates(Pattern(re.compile(re.escape(word)), (word.lower(),))))
        return sorted(found)
