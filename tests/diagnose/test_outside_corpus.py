"""Sanity of the `outside` corpus of real failure logs (tests/diagnose/real/outside/).

Collected as the first held-out set of issue 15 (scored once, blind: 61/77 = 0.79), it is
now part of what signatures are written against; a later held-out set lives in real/heldout.

The held-out logs measure how `dalle-dist doctor` does on logs its signature writer never
saw, so the corpus must stay what it claims to be: every log listed with the public thread
it came from, labelled with a category doctor knows (or `benign` / `unknown`), and taken
only from repositories outside the five the signatures were developed on. These tests read
the corpus and signatures.CATEGORIES only; they never run doctor, so that choosing or
labelling a log can never depend on what doctor answers.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from dalle_dist.diagnose.signatures import BENIGN, CATEGORIES, UNKNOWN

HELDOUT = Path(__file__).parent / "real" / "outside"
SOURCES = HELDOUT / "SOURCES.json"
LABELS = (*CATEGORIES, BENIGN, UNKNOWN)
#: The development set's repositories (old and new owner names): none may appear here.
DEV_REPOS = frozenset({"microsoft/deepspeed", "deepspeedai/deepspeed", "pytorch/pytorch",
                       "horovod/horovod", "nvidia/apex", "lucidrains/dalle-pytorch"})
URL = re.compile(r"^https://github\.com/(?P<owner>[A-Za-z0-9_.-]+)/(?P<repo>[A-Za-z0-9_.-]+)"
                 r"/(?:issues|pull|discussions)/(?P<number>[0-9]+)$")
#: `<category>__<owner>-<repo>-<number>[-n].log`
NAME = re.compile(r"^(?P<category>[a-z0-9-]+)__(?P<source>.+?)-(?P<number>[0-9]+)"
                  r"(?:-[0-9]+)?\.log$")
MIN_LOGS, MIN_UNKNOWN = 60, 8


def _entries() -> list[dict[str, str]]:
    return json.loads(SOURCES.read_text(encoding="utf-8"))


def test_sources_and_log_files_match_one_to_one() -> None:
    """Catches a log added without a source entry, an entry whose file is missing, and
    an entry listed twice."""
    listed = [e["file"] for e in _entries()]
    on_disk = sorted(p.name for p in HELDOUT.glob("*.log"))
    assert len(listed) == len(set(listed)), [f for f, n in Counter(listed).items() if n > 1]
    assert sorted(listed) == on_disk, {"unlisted": sorted(set(on_disk) - set(listed)),
                                       "missing": sorted(set(listed) - set(on_disk))}


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["file"])
def test_entry_is_a_labelled_github_thread_outside_the_dev_repos(entry: dict[str, str]) -> None:
    """Catches a non-GitHub or malformed URL, a label doctor cannot answer, a file name
    that disagrees with its entry's category or thread, a dev-set repository (which would
    make the held-out figure optimistic), a missing evidence line, and an empty log."""
    assert set(entry) == {"file", "url", "category", "evidence"}, sorted(entry)
    url = URL.match(entry["url"])
    assert url, entry["url"]
    assert entry["category"] in LABELS, entry["category"]
    name = NAME.match(entry["file"])
    assert name, entry["file"]
    assert name["category"] == entry["category"]
    assert name["source"] == f"{url['owner']}-{url['repo']}" and name["number"] == url["number"]
    assert f"{url['owner']}/{url['repo']}".lower() not in DEV_REPOS, entry["url"]
    assert len(entry["evidence"].strip()) >= 20, entry["evidence"]
    assert (HELDOUT / entry["file"]).read_text(encoding="utf-8").strip()


def test_corpus_size_and_unknown_share() -> None:
    """Catches a corpus trimmed below its stated size, or one with so few `unknown` logs
    that answering `unknown` seldom would look free."""
    counts = Counter(e["category"] for e in _entries())
    assert sum(counts.values()) >= MIN_LOGS, counts
    assert counts[UNKNOWN] >= MIN_UNKNOWN, counts
