"""What differs between two texts, cut into spans and named by what usually makes a harness's requests volatile.

A harness that re-runs the same task with the same model answers can still send
different requests: the time in its system prompt, a random id for each tool
call, a temporary directory, how long a command took, a process id. Naming the
spans that differ tells a user which of these their harness has (and what to
pin before blaming the engine). Texts are compared by whitespace-delimited
chunks so a span keeps its context ("2026-12-06T10:00:00Z" whole, not "06"),
and each span is named by the first class, in `CLASSES` order, whose pattern
either side matches; "other" when none does.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DAYS = "mon|tue|wed|thu|fri|sat|sun"

#: class → pattern, tried in this order (a temporary path holds random letters; a timestamp holds a duration's digits)
CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("temporary path", re.compile(r"(/tmp/|/var/folders/|/private/var/|\\temp\\|\btmp[a-z0-9_]{6,}\b)", re.I)),
    ("random id", re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
                             r"|\b(call|toolu|msg|req|chatcmpl|run|resp)[_-][A-Za-z0-9]{6,}"
                             r"|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I)),
    ("timestamp or date", re.compile(r"\b\d{4}-\d{2}-\d{2}|\b\d{1,2}:\d{2}:\d{2}\b|\b1[5-9]\d{8}(\.\d+)?\b"
                                     rf"|\b({_DAYS})[a-z]*,? +({_MONTHS})[a-z]* +\d{{1,2}}\b"
                                     rf"|\b\d{{1,2}} +({_MONTHS})[a-z]* +\d{{4}}\b", re.I)),
    ("duration", re.compile(r"\b\d+(\.\d+)?\s?(ms|µs|us|ns|s|sec|secs|seconds?|m|min|minutes?)\b"
                            r"|\b(took|elapsed|in) \d", re.I)),
    ("process id", re.compile(r"\bpid\b[ =:#]*\d+|\bprocess \d+|\[\d{2,7}\]", re.I)),
)
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Span:
    kind: str
    a: str  # the span in the first text ("" where the second inserted it)
    b: str


#: classes a keyword before the span can give it ("pid 4242": only the number changes)
_KEYWORDED = frozenset({"duration", "process id"})


def classify(a: str, b: str, before: str = "") -> str:
    """The class of a changed span, from either side's text; `before`, the unchanged chunk in front of it, counts
    only for the classes named by a keyword."""
    for name, pattern in CLASSES:
        if pattern.search(a) or pattern.search(b):
            return name
    if before:
        for name, pattern in CLASSES:
            if name in _KEYWORDED and (pattern.search(f"{before} {a}") or pattern.search(f"{before} {b}")):
                return name
    return OTHER


def _chunks(text: str) -> list[str]:
    return re.findall(r"\S+|\s+", text)


def changed_spans(a: str, b: str) -> list[Span]:
    """The spans where `a` and `b` differ, whitespace-delimited chunks at a time, each classified."""
    left, right = _chunks(a), _chunks(b)
    spans = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, left, right, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        old, new = "".join(left[i1:i2]).strip(), "".join(right[j1:j2]).strip()
        before = next((c for c in reversed(left[:i1]) if not c.isspace()), "")
        if old or new:  # whitespace alone is not a span anyone reads
            spans.append(Span(classify(old, new, before), old, new))
    return spans


def readable_diff(a: str, b: str, names: tuple[str, str] = ("A", "B"), context: int = 1) -> list[str]:
    """A unified diff of the two texts, line by line, for a person."""
    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), names[0], names[1], n=context, lineterm=""))
