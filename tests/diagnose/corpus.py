"""Sets of failure logs with the category each should get, and doctor's score on them.

Two layouts. The written set (tests/diagnose/logs): `<category>__<what>.log`, the category
in the name. A real set (tests/diagnose/real/<set>/): logs users posted, trimmed to the
failing part, listed in SOURCES.json as {file, url, category, evidence}: the thread the
log comes from and what there (a maintainer's answer, the fix) supports the category.
The category is the thread's evidence, never what doctor answers. Used by the tests and
by tests/accuracy/doctor_accuracy.py; imports neither torch nor any engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dalle_dist.doctor.diagnosis import diagnose

SOURCES = "SOURCES.json"
SOURCE_KEYS = ("file", "url", "category", "evidence")


@dataclass(frozen=True)
class Case:
    """One log and the category the thread (or the written log's name) gives it."""

    file: str
    category: str
    text: str
    url: str = ""
    evidence: str = ""


def written_set(directory: Path) -> list[Case]:
    """The written logs, each with the category its name starts with."""
    return [Case(p.name, p.name.split("__")[0], p.read_text(errors="replace"))
            for p in sorted(directory.glob("*.log"))]


def sources(directory: Path) -> list[dict[str, Any]]:
    """The SOURCES.json entries of a real set, as written."""
    entries: list[dict[str, Any]] = json.loads((directory / SOURCES).read_text())
    return entries


def real_set(directory: Path) -> list[Case]:
    """The logs SOURCES.json lists, each with its thread's category."""
    return [Case(e["file"], e["category"], (directory / e["file"]).read_text(errors="replace"),
                 e.get("url", ""), e.get("evidence", "")) for e in sources(directory)]


def real_sets(root: Path) -> dict[str, Path]:
    """The real sets under `root`: every folder holding a SOURCES.json, by name."""
    return {p.parent.name: p.parent for p in sorted(root.glob(f"*/{SOURCES}"))}


@dataclass
class Score:
    """doctor's answers on a set: overall, per expected category, and what it confused."""

    total: int = 0
    correct: int = 0
    per_category: dict[str, list[int]] = field(default_factory=dict)  # [correct, total]
    confusions: list[dict[str, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": round(self.accuracy, 3), "correct": self.correct,
                "total": self.total,
                "per_category": {c: {"accuracy": round(ok / n, 3), "correct": ok, "total": n}
                                 for c, (ok, n) in sorted(self.per_category.items())},
                "confusions": self.confusions}


def score(cases: Iterable[Case]) -> Score:
    """Run doctor on every case and count its answers against the expected categories."""
    result = Score()
    for case in cases:
        got = diagnose(case.text).category
        counts = result.per_category.setdefault(case.category, [0, 0])
        counts[1] += 1
        result.total += 1
        if got == case.category:
            counts[0] += 1
            result.correct += 1
        else:
            result.confusions.append({"file": case.file, "expected": case.category,
                                      "got": got})
    return result
