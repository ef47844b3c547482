"""doctor's prefilter (which lines a pattern is tried on) never changes what it finds.

doctor tries a pattern only on the lines holding the pattern's rarest literal run, rules a
run out without scanning when the log's words cannot hold it, and stops a scan once a run
is on more lines than a rarer one (dalle_dist.doctor.log.Log, dalle_dist.doctor.prefilter).
These tests compare that with the plain reading: every pattern searched on every cleaned
line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dalle_dist.doctor.diagnosis import signature_patterns
from dalle_dist.doctor.log import Log
from dalle_dist.doctor.prefilter import DIGITS, Text, fold_digits, word_checks
from dalle_dist.doctor.signatures import SIGNATURES
from tests.diagnose.long_log import long_log

HERE = Path(__file__).parent
LOGS = sorted(HERE.glob("logs/*.log")) + sorted(HERE.glob("real/*/*.log"))
ALL_PATTERNS = [p for order in range(len(SIGNATURES)) for group in signature_patterns(order)
                for p in group]
LITERALS = sorted({lit for p in ALL_PATTERNS for lit in p.literals})


def _long_log() -> str:
    """bench/doctor_speed.py's log (long_log.py), short: many lines sharing the same common
    runs."""
    return long_log(3000, distinct=True)


def test_prefiltered_search_finds_what_a_plain_search_finds() -> None:
    """On every corpus log and a long synthetic one, each pattern matches on exactly the
    lines a regex search of every cleaned line finds. Fails when the prefilter drops a
    line that matches: a literal run misread from a pattern, a word check that rules out
    a present run (e.g. '<' tested as a word's end), or a scan stopped by its limit taken
    for an absent run."""
    texts = [p.read_text(errors="replace") for p in LOGS] + [_long_log()]
    for text in texts:
        log = Log(text)
        cleaned = [log.clean_line(i) for i in range(log.lines)]
        for pattern in ALL_PATTERNS:
            fast = [line for line, _ in log.search(pattern)]
            plain = [i for i, line in enumerate(cleaned) if pattern.regex.search(line)]
            assert fast == plain, (pattern.regex.pattern, text[:200])


def _rich_text(text: str) -> str:
    """`text` as rich text pastes it: quotes curly, `--` before an option an en dash, `...`
    an ellipsis, every space a no-break one. doctor's normalisation turns an ASCII text so
    changed back into itself."""
    text = re.sub(r"(?<=\s)--(?=[A-Za-z])", "\u2013", text)
    return (text.replace("'", "\u2019").replace('"', "\u201d").replace("...", "\u2026")
            .replace(" ", "\u00a0"))


def test_prefilter_reads_the_plain_punctuation() -> None:
    """A corpus log pasted through rich text is read as the log itself: the same cleaned
    lines, and each pattern matches on the same lines whether the prefilter picks them or
    every line is searched. Fails when the prefilter (the distinct lines it scans) sees the
    typographic text while the patterns see the plain one: a literal holding a quote or a
    space is then ruled out on lines that match."""
    for path in LOGS:
        text = path.read_text(errors="replace")
        if not text.isascii():
            continue  # already typographic: not turned back into itself
        log, twin = Log(text), Log(_rich_text(text))
        assert [twin.clean_line(i) for i in range(twin.lines)] == \
            [log.clean_line(i) for i in range(log.lines)], path.name
        for pattern in ALL_PATTERNS:
            fast = [line for line, _ in twin.search(pattern)]
            plain = [i for i in range(twin.lines) if pattern.regex.search(twin.clean_line(i))]
            assert fast == plain, (pattern.regex.pattern, path.name)


@pytest.mark.parametrize("text", [
    "step 1234 loss 5.678",
    "epoch 3:  45%|\u2588\u2588\u2588\u2588\u258c     | 4512/10000 [01:23<01:41, 53.9it/s]",
    "DeepSpeed\u52a0\u8f7d\u5931\u8d25 [WinError 2] \u7cfb\u7edf 123",
    "full-width \uff11\uff12\uff13, Arabic-Indic \u0661\u0662, emoji \U0001f525 9",
], ids=["ascii", "tqdm-blocks", "chinese", "other-digits"])
def test_folding_digits_through_bytes_is_translate(text: str) -> None:
    """The prefilter's digit folding of a non-ASCII log goes through its UTF-8 bytes (fast)
    and gives what str.translate gives: ASCII 1-9 become 0, every other character, other
    scripts' digits included, stays. Fails when the byte path folds or garbles a
    multi-byte character."""
    assert fold_digits(text) == text.translate(DIGITS)


@pytest.mark.parametrize(("literal", "text", "may_hold"), [
    ("out of memory", "cuda out of memory.", True),
    ("out of memory", "cuda out\tof\x1cmemory", True),    # absent, but its words are there
    ("out of memory", "cuda outx of memory", False),       # "out" must end a word
    (" of me", "cuda out of memory", True),                # "of" whole, "me" a word's start
    (" of me", "cuda out ofx memory", False),
    (" of me", "cuda out of xmemory", False),
    ("ut of", "cuda out of memory", True),                 # "ut" a word's end
    ("ut of", "cuda utx of memory", False),
    ("amp_c'", "no module named 'amp_c'", True),           # inside a word
    ("amp_c'", "no module named 'amp_cx", False),
    ("named 'torch", "no module\u00a0named 'torch._six'", True),  # no-break space splits
    ("module named", "no module\u00a0named 'torch._six'", True),  # absent, words there
])
def test_word_checks_rule_out_only_absent_literals(literal: str, text: str,
                                                   may_hold: bool) -> None:
    """A literal is ruled out only when it is not in the text: its pieces are looked up as
    whole words, a word's start, a word's end or a part of a word, as str.split() cuts
    words. Fails when a check reads a piece's bound on the wrong side or cuts words at
    other whitespace than the text's."""
    got = Text(text.split("\n")).may_hold(literal)
    assert got is may_hold, word_checks(literal)
    assert got or literal not in text


def test_word_checks_never_rule_out_a_literal_of_the_corpus() -> None:
    """Every signature literal the word checks rule out on a corpus log is truly absent
    from it, and they rule out most absent ones (the reason they exist). Fails when a
    check is too strict (a present literal ruled out) or does nothing."""
    ruled_out = absent = 0
    for path in LOGS:
        lines = [line.lower() for line in
                 path.read_text(errors="replace").translate(DIGITS).split("\n")]
        text = Text(lines)
        for literal in LITERALS:
            folded = literal.translate(DIGITS)
            present = folded in text.text
            absent += not present
            if not text.may_hold(folded):
                assert not present, (path.name, literal)
                ruled_out += 1
    assert ruled_out > absent // 2, (ruled_out, absent)
