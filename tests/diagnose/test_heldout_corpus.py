"""Sanity of the fresh held-out corpus of real failure logs (tests/diagnose/real/heldout/).

Issue 15: after the first held-out set became the `outside` development set, this second
set measures how `dalle-dist doctor` does on logs that nobody writing its signatures has
seen. It is only worth that if it stays what it claims to be: every log listed once with
the public GitHub thread it came from, labelled with a category doctor knows (or `benign`
/ `unknown`) on the thread's own evidence, and taken only from repositories that appear
neither in the five development repositories nor in the `dev` and `outside` sets.

These tests read the corpus, the other sets' SOURCES.json and signatures.CATEGORIES only;
they never run doctor, so that choosing or labelling a log can never depend on what
doctor answers.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from dalle_dist.diagnose.signatures import BENIGN, CATEGORIES, UNKNOWN

REAL = Path(__file__).parent / "real"
HELDOUT = REAL / "heldout"
SOURCES = HELDOUT / "SOURCES.json"
LABELS = (*CATEGORIES, BENIGN, UNKNOWN)
#: The five development repositories (old and new owner names).
DEV_REPOS = frozenset({"microsoft/deepspeed", "deepspeedai/deepspeed", "pytorch/pytorch",
                       "horovod/horovod", "nvidia/apex", "lucidrains/dalle-pytorch"})
URL = re.compile(r"^https://github\.com/(?P<owner>[A-Za-z0-9_.-]+)/(?P<repo>[A-Za-z0-9_.-]+)"
                 r"/(?:issues|pull|discussions)/(?P<number>[0-9]+)$")
#: `<category>__<owner>-<repo>-<number>[-n].log`
NAME = re.compile(r"^(?P<category>[a-z0-9-]+)__(?P<source>.+?)-(?P<number>[0-9]+)"
                  r"(?:-[0-9]+)?\.log$")
MIN_LOGS, MIN_UNKNOWN = 45, 6


def _entries() -> list[dict[str, str]]:
    return json.loads(SOURCES.read_text(encoding="utf-8"))


def _repo(url: str) -> str:
    match = URL.match(url)
    assert match, url
    return f"{match['owner']}/{match['repo']}".lower()


def _used_repos() -> frozenset[str]:
    """Repositories the signatures were written against: the five dev repositories and
    every repository of the `dev` and `outside` sets (read from their SOURCES.json)."""
    used = set(DEV_REPOS)
    for other in ("dev", "outside"):
        for entry in json.loads((REAL / other / "SOURCES.json").read_text(encoding="utf-8")):
            used.add(_repo(entry["url"]))
    return frozenset(used)


def test_sources_and_log_files_match_one_to_one() -> None:
    """Catches a log added without a source entry, an entry whose file is missing, and
    an entry listed twice."""
    listed = [e["file"] for e in _entries()]
    on_disk = sorted(p.name for p in HELDOUT.glob("*.log"))
    assert len(listed) == len(set(listed)), [f for f, n in Counter(listed).items() if n > 1]
    assert sorted(listed) == on_disk, {"unlisted": sorted(set(on_disk) - set(listed)),
                                       "missing": sorted(set(listed) - set(on_disk))}


def test_one_log_per_thread() -> None:
    """Catches two logs from the same thread, which would weigh one user's report twice."""
    urls = Counter(e["url"] for e in _entries())
    assert [u for u, n in urls.items() if n > 1] == []


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["file"])
def test_entry_is_a_labelled_thread_outside_every_used_repo(entry: dict[str, str]) -> None:
    """Catches a non-GitHub or malformed URL, a label doctor cannot answer, a file name
    that disagrees with its entry's category or thread, a repository already used by the
    dev or outside sets (which would make the held-out figure optimistic), a missing
    evidence line, and an empty log."""
    assert set(entry) == {"file", "url", "category", "evidence"}, sorted(entry)
    url = URL.match(entry["url"])
    assert url, entry["url"]
    assert entry["category"] in LABELS, entry["category"]
    name = NAME.match(entry["file"])
    assert name, entry["file"]
    assert name["category"] == entry["category"]
    assert name["source"] == f"{url['owner']}-{url['repo']}" and name["number"] == url["number"]
    assert _repo(entry["url"]) not in _used_repos(), entry["url"]
    assert len(entry["evidence"].strip()) >= 20, entry["evidence"]
    assert (HELDOUT / entry["file"]).read_text(encoding="utf-8").strip()


def test_corpus_size_and_unknown_share() -> None:
    """Catches a corpus trimmed below its stated size, or one with so few `unknown` logs
    that answering `unknown` seldom would look free."""
    counts = Counter(e["category"] for e in _entries())
    assert sum(counts.values()) >= MIN_LOGS, counts
    assert counts[UNKNOWN] >= MIN_UNKNOWN, counts
