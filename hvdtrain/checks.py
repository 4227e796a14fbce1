"""The argument checks every module shares: an integer that is not a bool, a positive
number, each with one wording for its error.

Python's ``bool`` is an ``int``, so ``batch_size=True`` would pass an ``isinstance`` check:
these helpers refuse it, and name the argument, the value and what is expected.
"""
from __future__ import annotations

from typing import Any


def is_integer(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for an ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(value: Any, name: str, *, minimum: int | None = None,
            optional: bool = False) -> int | None:
    """``value`` if it is an integer (not a bool) of at least ``minimum``.

    Args:
        value: what the caller gave.
        name: the argument's name, for the error.
        minimum: the smallest value allowed (``None``: any integer).
        optional: ``None`` is allowed too (and returned).

    Raises:
        ValueError: e.g. ``"batch_size must be a positive integer, got 0"``.
    """
    if optional and value is None:
        return None
    if not is_integer(value) or (minimum is not None and value < minimum):
        words = ("an integer" if minimum is None else "a positive integer" if minimum == 1
                 else f"an integer >= {minimum}")
        raise ValueError(f"{name} must be {'None or ' if optional else ''}{words}, got {value!r}")
    return value


def positive_int(value: Any, name: str) -> int:
    """``value`` if it is an integer > 0.

    Raises:
        ValueError: naming ``name`` and the value.
    """
    return integer(value, name, minimum=1)


def positive_number(value: Any, name: str, *, optional: bool = False, of: str = "") -> float | None:
    """``value`` as a float if it is a number > 0 (``math.inf`` included).

    Args:
        value: what the caller gave.
        name: the argument's name, for the error.
        optional: ``None`` is allowed too (and returned).
        of: the unit, for the error (``"seconds"``: "a positive number of seconds").

    Raises:
        ValueError: e.g. ``"connect_timeout must be a positive number, got 0"``.
    """
    if optional and value is None:
        return None
    if not is_number(value) or not value > 0:
        raise ValueError(f"{name} must be {'None or ' if optional else ''}a positive number"
                         f"{' of ' + of if of else ''}, got {value!r}")
    return float(value)
