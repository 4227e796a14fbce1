"""hvdtrain's source patches for Horovod, and a strict applier for them.

The patches are unified diffs in ``patches/`` (applied in name order); each hunk must
match the source exactly, once, or the build stops naming the patch and the file. No
``patch`` or ``git`` program is needed, so the same code runs in any Python environment.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

PATCH_DIR = Path(__file__).resolve().parent / "patches"


class PatchError(RuntimeError):
    """A patch does not apply to the Horovod source it was given."""


@dataclass
class _Hunk:
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


def patch_files() -> list[Path]:
    """The patches, in the order they are applied."""
    return sorted(PATCH_DIR.glob("*.patch"))


def patch_id() -> str:
    """A short hash of every patch's name and text: part of the wheel cache key, so a
    wheel built with other (or no) patches is never reused."""
    digest = hashlib.sha256()
    for path in patch_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:10]


_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _parse(text: str, name: str) -> dict[str, list[_Hunk]]:
    """File path (relative to the source root) -> its hunks, from a unified diff.

    Each hunk is read by the line counts of its ``@@`` header, so a removed line that
    itself starts with ``--`` is never taken for the next file's header.
    """
    files: dict[str, list[_Hunk]] = {}
    current: list[_Hunk] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            current = files.setdefault(target[2:] if target.startswith("b/") else target, [])
            continue
        header = _HUNK_HEADER.match(line)
        if not header:
            continue  # the patch's description, or a '---' line
        if current is None:
            raise PatchError(f"{name}: a hunk before any '+++' file line")
        old_left, new_left = (int(n) if n is not None else 1 for n in header.groups())
        hunk = _Hunk()
        while old_left or new_left:
            if i >= len(lines):
                raise PatchError(f"{name}: the file ends inside a hunk")
            body = lines[i]
            i += 1
            kind, body = (body[:1], body[1:]) if body else (" ", "")
            if kind not in " -+":
                raise PatchError(f"{name}: unexpected line in a hunk: {kind + body!r}")
            if kind in " -":
                hunk.old.append(body)
                old_left -= 1
            if kind in " +":
                hunk.new.append(body)
                new_left -= 1
        current.append(hunk)
    if not any(files.values()):
        raise PatchError(f"{name}: no hunks found (expected a unified diff)")
    return files


def apply_patch(patch: Path, source_root: Path) -> list[str]:
    """Apply one unified diff to the tree under ``source_root``.

    Returns:
        The files it changed, relative to ``source_root``.

    Raises:
        PatchError: a file is missing, or a hunk's old lines are not found exactly once.
    """
    changed = []
    for relative, hunks in _parse(patch.read_text(), patch.name).items():
        path = source_root / relative
        if not path.is_file():
            raise PatchError(f"{patch.name}: {relative} does not exist in {source_root}")
        lines = path.read_text().split("\n")
        for number, hunk in enumerate(hunks, 1):
            width = len(hunk.old)
            starts = [i for i in range(len(lines) - width + 1) if lines[i:i + width] == hunk.old]
            if len(starts) != 1:
                found = "not found" if not starts else f"found {len(starts)} times"
                raise PatchError(f"{patch.name}: hunk {number} of {relative} {found} "
                                 f"(expected once): is this the Horovod source it was made for?")
            lines[starts[0]:starts[0] + width] = hunk.new
        path.write_text("\n".join(lines))
        changed.append(relative)
    return changed


def apply_all(source_root: Path) -> list[str]:
    """Apply every patch in order; returns the names of the patches applied."""
    for patch in patch_files():
        apply_patch(patch, source_root)
    return [patch.name for patch in patch_files()]
