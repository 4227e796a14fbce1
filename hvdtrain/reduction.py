"""The reduction settings' checks (``op``, ``compression``, ``backward_passes_per_step``),
run by :class:`hvdtrain.options.ReductionOptions` for the Trainer and for
``DistributedOptimizer`` alike, before Horovod starts: no Horovod import here, only the
names and Horovod's constants for them.
"""
from __future__ import annotations

from typing import Any

from hvdtrain.checks import is_integer, is_number, positive_int


#: The gradient reductions by name, and Horovod's values for them (``hvd.Average``,
#: ``hvd.Sum``, ``hvd.Adasum``, its ``ReduceOp`` enum; tests/unit/test_exchanger.py checks
#: them against Horovod's), so the setting is checked before Horovod starts.
GRADIENT_OPS = {"average": 0, "sum": 1, "adasum": 2}
#: The compressions by name (``hvdtrain.horovod.compression``).
COMPRESSIONS = ("none", "fp16", "topk", "randomk", "powersgd")
_SPARSIFIERS = ("topk", "randomk")


def check_op(op: Any) -> Any:
    """``op`` if it names a gradient reduction (or is Horovod's constant for one).

    Raises:
        ValueError: naming the accepted values.
    """
    if isinstance(op, str) and op.lower() in GRADIENT_OPS:
        return op
    if is_integer(op) and op in GRADIENT_OPS.values():
        return op
    names = ", ".join(repr(n) for n in GRADIENT_OPS)
    raise ValueError(f"op must be one of {names} (or hvdtrain."
                     f"{'/'.join(n.capitalize() for n in GRADIENT_OPS)}), got {op!r}")


def check_compression(compression: Any, ratio: Any = None, rank: Any = None) -> Any:
    """``compression`` if it names a compression, is one of Horovod's compressors
    (``Compression.none`` / ``.fp16``), a sparsifier (``hvdtrain.compression.TopK``) or
    ``hvdtrain.compression.PowerSGD``; a sparsifier's ``ratio``, when given, is in (0, 1],
    PowerSGD's ``rank`` a positive integer.

    Raises:
        ValueError: naming the accepted values, or the ratio or rank.
    """
    if rank is not None:
        positive_int(rank, "compression_rank")
        if not (isinstance(compression, str) and compression.lower() == "powersgd"):
            raise ValueError(f"compression_rank is PowerSGD's: it needs compression='powersgd', "
                             f"got compression={compression!r}")
    if isinstance(compression, str) and compression.lower() in COMPRESSIONS:
        name = compression.lower()
        if name in _SPARSIFIERS and ratio is not None and (
                not is_number(ratio) or not 0 < ratio <= 1):
            raise ValueError(f"{name} compression ratio must be in (0, 1], got {ratio!r}")
        return compression
    horovods = (isinstance(compression, type) and callable(getattr(compression, "compress", None))
                and callable(getattr(compression, "decompress", None)))
    sparsifier = callable(getattr(compression, "select", None)) and hasattr(compression, "ratio")
    low_rank = callable(getattr(compression, "matrix_shape", None))
    if compression is None or horovods or sparsifier or low_rank:
        return compression
    raise ValueError(f"compression must be one of {list(COMPRESSIONS)} (or a Horovod compressor / "
                     "hvdtrain.compression.TopK(ratio) / hvdtrain.compression.PowerSGD(rank)), "
                     f"got {compression!r}")


def check_backward_passes(value: Any) -> int:
    """``backward_passes_per_step`` if it is an integer >= 1.

    Raises:
        ValueError: naming the value.
    """
    return positive_int(value, "backward_passes_per_step")
