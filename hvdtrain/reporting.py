"""hvdtrain's log lines: ``[hvdtrain] ...`` at INFO on the chief, warnings only elsewhere."""
from __future__ import annotations

import logging

logger = logging.getLogger("hvdtrain")


def setup_logging(rank: int) -> None:
    """INFO logging on rank 0 (the chief), warnings only on the other ranks. A handler is
    added only when neither hvdtrain's logger nor the root logger has one."""
    if rank != 0:
        logger.setLevel(logging.WARNING)
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[hvdtrain] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def format_logs(values: dict) -> str:
    """``name=value`` pairs with four decimals, in the order given."""
    return " ".join(f"{k}={float(v):.4f}" for k, v in values.items())
