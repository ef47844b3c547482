"""How doctor reads a log line: the engine's own words, without what was put around them.

Lines are matched after removing ANSI colours, making typographic punctuation plain
(curly quotes, an en/em dash for an option's `--`, no-break spaces: what rich text turns a
pasted log into), and removing what launchers, loggers and CI put before a line
(`[rank0]:`, `[1,0]<stderr>:`, `<stderr>:`, timestamps, glog headers such as
`E0213 12:07:20.086 42 api.py:874]`, DeepSpeed's `[<time>] [INFO] [f:l:fn]`, Python
logging's `ERROR:name:`, quoting `> ` and backticks of pasted logs), so a signature keys on
the engine's own wording only. What doctor quotes from the log stays as the log has it.
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\n]*\x07")
# What launchers, loggers, CI and issue trackers put before a rank's own line; removed
# (repeatedly: prefixes stack, e.g. `[rank0]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] `)
# before matching. Every alternative ends in a separator, so no message text is eaten.
PREFIX = re.compile(
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
# character through the mapping, far slower on a long log than scanning for these few:
# docs/benchmarks.md, "dalle-dist doctor")
_TYPOGRAPHIC = re.compile("[" + "".join(_PUNCTUATION) + "]")
# An en or em dash (or one next to a hyphen) that starts an option name: `–local_rank`,
# `—deepspeed`, `-–fp16`. Not after a word, a number or a path (`1–5`, `a–b`), and not
# before a space (a dash in prose); `_option_dash` looks at what comes before (the pattern
# starts with the dash itself, so a long log is scanned for it quickly).
_OPTION_DASH = re.compile(r"[\u2013\u2014]-?(?=[A-Za-z])")
_NOT_BEFORE_OPTION = re.compile(r"[\w.\-/\\\u2013\u2014]")


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

