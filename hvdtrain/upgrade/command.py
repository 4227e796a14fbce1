"""The ``hvdtrain upgrade`` command (also ``python -m hvdtrain.upgrade``).

Without ``-o`` or ``--in-place`` the rewritten script goes to stdout and the report to
stderr, so ``hvdtrain upgrade a.py > b.py`` works like a filter; with either, the report
goes to stdout. ``--in-place`` writes through a temporary file renamed over the script, so
an error never leaves it half written, and keeps the original as ``SCRIPT.orig`` unless
``--no-backup``. The file's encoding and line endings are kept.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import tokenize
from pathlib import Path
from typing import Sequence

from hvdtrain.upgrade.rewrite import upgrade_source


class UpgradeError(Exception):
    """A script that cannot be read, parsed or written; the message names it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options, shared by ``hvdtrain upgrade`` and ``-m``."""
    parser.add_argument("script", type=Path, help="the Horovod TensorFlow 2 script")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                       help="write the rewritten script to OUT (the report to stdout)")
    where.add_argument("--in-place", action="store_true",
                       help="rewrite SCRIPT itself, keeping the original as SCRIPT.orig")
    parser.add_argument("--no-backup", action="store_true",
                        help="with --in-place: keep no SCRIPT.orig")


def read_script(path: Path) -> tuple[str, str]:
    """(text, encoding) of a Python file, decoded as Python would (its coding line or BOM),
    with its line endings as they are."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UpgradeError(f"{path}: no such file") from None
    except OSError as err:
        raise UpgradeError(f"{path}: {err.strerror or err}") from None
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(raw).readline)[0]
        return raw.decode(encoding), encoding
    except (SyntaxError, UnicodeDecodeError, LookupError) as err:
        raise UpgradeError(f"{path}: cannot decode it: {err}") from None


def encoding_of(path: Path) -> str:
    """The encoding Python reads ``path`` in (its coding line or BOM, else UTF-8)."""
    with open(path, "rb") as f:
        return tokenize.detect_encoding(f.readline)[0]


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in its folder renamed over it
    (the file's permission bits kept)."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def upgrade_file(args: argparse.Namespace) -> tuple[list[str], bytes | None]:
    """Rewrite ``args.script`` as ``args`` say: (the report's lines, the rewritten bytes
    when they go to stdout)."""
    path: Path = args.script
    if args.output is not None and args.output.resolve() == path.resolve():
        raise UpgradeError(f"{args.output} is the script itself: use --in-place")
    text, encoding = read_script(path)
    try:
        result = upgrade_source(text, str(path))
    except SyntaxError as err:
        where = f"{path}:{err.lineno}" + (f":{err.offset}" if err.offset else "")
        raise UpgradeError(f"{where}: {err.msg} (the script must be valid Python 3 "
                           "before it is upgraded)") from None
    report = result.report(str(path))
    data = result.text.encode(encoding)
    if args.output is not None:
        write_atomically(args.output, data)
        report.append(f"wrote {args.output}")
        return report, None
    if args.in_place:
        if result.changes:
            if not args.no_backup:
                backup = path.with_name(path.name + ".orig")
                write_atomically(backup, path.read_bytes())
                report.append(f"kept the original as {backup}")
            write_atomically(path, data)
            report.append(f"rewrote {path}")
        else:
            report.append(f"{path} left as it is (nothing to rewrite)")
        return report, None
    return report, data


def run(args: argparse.Namespace) -> int:
    """Run the command; 0 on success (notes included), 1 when the script cannot be read,
    parsed or written."""
    if args.no_backup and not args.in_place:
        print("hvdtrain upgrade: error: --no-backup goes with --in-place", file=sys.stderr)
        return 2
    try:
        report, data = upgrade_file(args)
    except (UpgradeError, OSError) as err:
        print(f"hvdtrain upgrade: error: {err}", file=sys.stderr)
        return 1
    if data is not None:
        out = getattr(sys.stdout, "buffer", None)
        if out is None:  # a text-only stdout (an IDE's, a test's): the text as it is
            sys.stdout.write(data.decode(encoding_of(args.script)))
        else:
            sys.stdout.flush()
            out.write(data)
            out.flush()
        print("\n".join(report), file=sys.stderr)
    else:
        print("\n".join(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hvdtrain.upgrade``."""
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.upgrade",
                                     description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


DESCRIPTION = ("Rewrites a Horovod TensorFlow 2 script for hvdtrain on Keras 3: the "
               "horovod.tensorflow[.keras] imports become hvdtrain.tensorflow[.keras] and "
               "the Keras 2 idioms Keras 3 rejects are rewritten, or reported with the "
               "manual fix. Prints one line per change and per place to fix by hand.")
