"""Edits inside a call's argument list: the arguments' exact extents (parentheses around
an argument included), removing some of them with their commas, naming a positional one.

Between two arguments the text holds only blanks, comments, parentheses, line
continuations and one comma (strings belong to the arguments), so a small scanner finds
the commas without tokenizing."""
from __future__ import annotations

import ast
from typing import Iterator

from hvdtrain.upgrade.source import Change, Edit, Note, Source


def _skip(text: str, at: int, end: int, step: int = 1) -> int:
    """The first offset from ``at`` towards ``end`` that is not blank (forward: comments
    and continuations skipped too)."""
    while at != end:
        char = text[at if step > 0 else at - 1]
        if char in " \t\r\n\f\\":
            at += step
        elif char == "#" and step > 0:
            while at != end and text[at] not in "\r\n":
                at += 1
        else:
            break
    return at


def _comma(text: str, start: int, end: int) -> int | None:
    """The offset of the comma between two arguments, in ``text[start:end]``."""
    at = start
    while at < end:
        if text[at] == "#":
            while at < end and text[at] not in "\r\n":
                at += 1
            continue
        if text[at] == ",":
            return at
        at += 1
    return None


def _has_comment(text: str, start: int, end: int) -> bool:
    return "#" in text[start:end]


def items(src: Source, call: ast.Call) -> list[tuple[int, int, ast.AST]]:
    """The call's arguments in source order: (start, end, node), an argument's own
    parentheses included (``f((a), b)``)."""
    text = src.text
    _, call_end = src.span(call)
    opening = _skip(text, src.span(call.func)[1], call_end)  # the call's "("
    closing = call_end - 1
    found = []
    for node in [*call.args, *call.keywords]:
        start, end = src.span(node)
        while True:
            before = _skip(text, start, opening + 1, -1)
            after = _skip(text, end, closing)
            if before - 1 > opening and text[before - 1] == "(" and text[after] == ")" \
                    and after < closing:
                start, end = before - 1, after + 1
            else:
                break
        found.append((start, end, node))
    return sorted(found, key=lambda item: item[0])


def _tidy(src: Source, start: int, stop: int, eat_blanks: bool = False) -> Edit:
    """The deletion of ``text[start:stop]``, widened to whole lines when nothing else is
    on them (a comment after ``stop`` goes with them), else to the blanks before it when
    the line ends or a comment follows, else to the blanks after it (``eat_blanks``)."""
    text = src.text
    line_start, line_end = src.line_start(start), src.line_end(max(start, stop - 1))
    rest = text[stop:line_end].strip()
    if not text[line_start:start].strip() and (not rest or rest.startswith("#")):
        return Edit(line_start, line_end, "")
    after = stop
    while after < line_end and text[after] in " \t":
        after += 1
    if after == line_end or text[after] in "#\r\n":  # the line ends or a comment follows:
        while start > line_start and text[start - 1] in " \t":  # keep its own spacing
            start -= 1
    elif eat_blanks:
        stop = after
    return Edit(start, stop, "")


def remove(src: Source, call: ast.Call, doomed: set[int]) -> list[Edit] | None:
    """Edits that remove the arguments at ``doomed`` (indices into :func:`items`) with
    their commas, keeping every comment that belongs to an argument that stays; None if
    the list's shape is one this does not handle."""
    text, spans = src.text, items(src, call)
    closing = src.span(call)[1] - 1
    edits, i, n = [], 0, len(spans)
    while i < n:
        if i not in doomed:
            i += 1
            continue
        j = i
        while j + 1 < n and j + 1 in doomed:
            j += 1
        start, end = spans[i][0], spans[j][1]
        if j + 1 < n:  # an argument stays after the run: take the run and its comma
            comma = _comma(text, end, spans[j + 1][0])
            if comma is None:
                return None
            edits.append(_tidy(src, start, comma + 1, eat_blanks=True))
        elif i > 0:  # the run ends the list: take the comma before it
            trailing = _comma(text, end, closing)
            comma = _comma(text, spans[i - 1][1], start)
            if comma is None:
                return None
            if _has_comment(text, comma, start):  # a comment after that comma stays
                edits.append(_tidy(src, start, end if trailing is None else trailing + 1))
            else:
                edits.append(Edit(comma, end, ""))
        else:  # every argument goes
            trailing = _comma(text, end, closing)
            edits.append(_tidy(src, start, end if trailing is None else trailing + 1))
        i = j + 1
    return edits


def name_positional(src: Source, call: ast.Call, node: ast.AST, name: str) -> Edit:
    """The edit that passes positional argument ``node`` as ``name=``."""
    start = next(s for s, _, n in items(src, call) if n is node)
    return Edit(start, start, f"{name}=")


def append_keyword(src: Source, call: ast.Call, text: str) -> Edit:
    """The edit that adds ``text`` (``verbose=0``) after the call's last argument."""
    spans = items(src, call)
    if spans:
        return Edit(spans[-1][1], spans[-1][1], f", {text}")
    end = src.span(call)[1] - 1
    return Edit(end, end, text)


def drop_keywords(src: Source, call: ast.Call, names, why: str,
                  more=()) -> Iterator[Change | Note]:
    """The change that removes the keywords ``names`` from ``call``, and the arguments at
    ``more`` (indices into :func:`items`); a note when the list is not one to edit."""
    spans = items(src, call)
    doomed = {i for i, (_, _, n) in enumerate(spans)
              if isinstance(n, ast.keyword) and n.arg in names} | set(more)
    if not doomed:
        return
    edits = remove(src, call, doomed)
    old = ", ".join(src.text[spans[i][0]:spans[i][1]] for i in sorted(doomed))
    first = spans[min(doomed)][2]
    if edits is None:
        yield Note(first.lineno, old, f"remove by hand: {why}")
        return
    yield Change(first.lineno, spans[min(doomed)][0], spans[max(doomed)][1], why, edits,
                 old=old, new="(removed)")
