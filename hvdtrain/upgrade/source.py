"""A script's text and the positions of its syntax tree: character offsets from ``ast``'s
(line, UTF-8 byte column) pairs, the edits of a rewrite and their application.

Every change splices the original text: what no edit touches stays byte for byte
(comments, formatting, line endings)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

_NEWLINE = re.compile(r"\r\n|\r|\n")  # what Python's tokenizer counts as a line end


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` (character offsets) by ``new``; ``start == end`` inserts."""

    start: int
    end: int
    new: str


@dataclass
class Change:
    """One rewrite as the report shows it: ``line: old -> new  (why)``.

    ``old`` and ``new`` are what the report prints (by default the span ``start:end``
    before and after every edit inside it); ``check`` says what to verify
    by hand when the rewrite is right but may not be all that is needed.
    """

    line: int
    start: int
    end: int
    why: str
    edits: list[Edit]
    old: str | None = None
    new: str | None = None
    check: str | None = None


@dataclass
class Note:
    """Something found that is not rewritten: ``line: found: fix``."""

    line: int
    found: str
    fix: str


@dataclass
class Found:
    """What the rules found: changes to make and places to fix by hand."""

    changes: list[Change] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


class Source:
    """A script's text, with ``ast`` positions turned into offsets in it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]

    def offset(self, lineno: int, col: int) -> int:
        """The character offset of ``ast``'s (1-based line, UTF-8 byte column)."""
        start = self._starts[lineno - 1]
        end = self._starts[lineno] if lineno < len(self._starts) else len(self.text)
        line = self.text[start:end]
        if line.isascii():
            return start + col
        return start + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        """``node``'s (start, end) character offsets."""
        return (self.offset(node.lineno, node.col_offset),
                self.offset(node.end_lineno, node.end_col_offset))

    def segment(self, node: ast.AST) -> str:
        """``node``'s exact source text."""
        start, end = self.span(node)
        return self.text[start:end]

    def module_start(self, node: ast.ImportFrom) -> int | None:
        """The offset of ``from X import``'s ``X``, None when it is not written plainly."""
        start = self.span(node)[0]
        found = re.match(r"from\s+", self.text[start:start + 200])
        at = start + (found.end() if found else 0)
        return at if found and self.text.startswith(node.module or "\0", at) else None

    def line_of(self, offset: int) -> int:
        """The 1-based line holding character ``offset``."""
        low, high = 0, len(self._starts) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self._starts[mid] <= offset:
                low = mid
            else:
                high = mid - 1
        return low + 1

    def line_start(self, offset: int) -> int:
        """The offset where ``offset``'s line starts."""
        return self._starts[self.line_of(offset) - 1]

    def line_end(self, offset: int) -> int:
        """The offset just past ``offset``'s line and its line ending."""
        line = self.line_of(offset)
        return self._starts[line] if line < len(self._starts) else len(self.text)


def apply(text: str, edits: list[Edit]) -> str:
    """``text`` with non-overlapping ``edits`` made (insertions before a replacement that
    starts at the same offset)."""
    out, at = [], 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        out.append(text[at:edit.start])
        out.append(edit.new)
        at = max(at, edit.end)
    out.append(text[at:])
    return "".join(out)


def overlaps(a: Edit, b: Edit) -> bool:
    """Whether two edits touch the same characters (two insertions never do)."""
    return a.start < b.end and b.start < a.end
