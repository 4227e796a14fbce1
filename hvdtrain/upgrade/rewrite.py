"""``upgrade_source``: a Horovod TF2 script's text rewritten for hvdtrain on Keras 3, and
the report of what changed and what to fix by hand."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from hvdtrain.upgrade import horovod_imports, keras3, keras3_files
from hvdtrain.upgrade.names import Module
from hvdtrain.upgrade.source import Change, Note, Source, apply, overlaps

RULES = (horovod_imports.rules, keras3.rules, keras3_files.rules)


@dataclass
class Result:
    """The rewritten text, the changes made and the places left to fix by hand."""

    text: str
    changes: list[Change]
    notes: list[Note]
    olds: dict[int, tuple[str, str]]  # id(change) -> (old, new) as the report shows them

    def report(self, path: str) -> list[str]:
        """The report's lines: ``path:line: old -> new  (why)`` for each change (with
        ``CHECK:`` when it needs a look), ``path:line: NOT REWRITTEN: found: fix`` for each
        note, then a summary line."""
        lines = []
        for change in self.changes:
            old, new = self.olds[id(change)]
            check = f"; CHECK: {change.check}" if change.check else ""
            lines.append(f"{path}:{change.line}: {old} -> {new}  ({change.why}{check})")
        for note in self.notes:
            lines.append(f"{path}:{note.line}: NOT REWRITTEN: {_short(note.found)}: "
                         f"{note.fix}")
        checks = sum(1 for c in self.changes if c.check)
        lines.append(f"{path}: {len(self.changes)} change{'s' * (len(self.changes) != 1)}, "
                     f"{len(self.notes) + checks} to fix or check by hand")
        return lines


def _short(text: str, width: int = 120) -> str:
    """``text`` on one line (runs of blanks and line breaks as one space), cut at
    ``width``."""
    text = re.sub(r"\s*[\r\n]\s*", " ", text).strip()
    return text if len(text) <= width else text[:width - 3] + "..."


def upgrade_source(text: str, filename: str = "<script>") -> Result:
    """Rewrite a script's text for hvdtrain on Keras 3.

    Args:
        text: the script.
        filename: named in a syntax error.

    Returns:
        The rewritten text (byte for byte the same outside the changes) with its changes
        and notes, each sorted by line.

    Raises:
        SyntaxError: the script does not parse (its ``filename`` and ``lineno`` say where).
    """
    tree = ast.parse(text, filename)
    mod = Module(Source(text), tree)
    changes, notes, same = [], [], {}
    for rule in RULES:
        for item in rule(mod):
            if isinstance(item, Change):
                changes.append(item)
            elif (item.line, item.fix) not in same:  # one note per line and fix
                same[item.line, item.fix] = item
                notes.append(item)
            elif item.found not in same[item.line, item.fix].found:
                same[item.line, item.fix].found += ", " + item.found
    kept, edits = [], []
    for change in changes:
        fresh = [e for e in change.edits if e not in edits]
        clash = next((e for e in fresh for other in edits if overlaps(e, other)), None)
        if clash is not None:
            notes.append(Note(change.line, mod.source.text[change.start:change.end],
                              f"not rewritten, it overlaps another change: {change.why}"))
            continue
        if not fresh:
            continue  # another rule made exactly this change
        edits.extend(fresh)
        kept.append(change)
    olds = {}
    for change in kept:
        segment = text[change.start:change.end]
        inside = [type(e)(e.start - change.start, e.end - change.start, e.new) for e in edits
                  if change.start <= e.start and e.end <= change.end]
        olds[id(change)] = (_short(change.old if change.old is not None else segment),
                            _short(change.new if change.new is not None
                                   else apply(segment, inside)))
    kept.sort(key=lambda c: (c.line, c.start))
    notes.sort(key=lambda n: n.line)
    return Result(apply(text, edits), kept, notes, olds)
