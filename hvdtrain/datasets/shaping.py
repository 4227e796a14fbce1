"""Turning uint8 images into the float32 splits the loaders return."""
from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger("hvdtrain")


def check_shape(shape) -> tuple:
    """``shape`` as a tuple of ints with at most one -1 (raises ValueError otherwise)."""
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"shape={shape!r} must be a sequence of ints") from e
    if sum(d == -1 for d in dims) > 1 or any(d < -1 for d in dims):
        raise ValueError(f"shape={shape!r} may contain at most one -1 and no other negative sizes")
    return dims


def to_float(x: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    """``x`` scaled to float32 in [0, 1] and reshaped to ``shape``; ``what`` names it in errors."""
    out = x.astype(np.float32)
    out *= np.float32(1.0 / 255.0)
    try:
        return out.reshape(shape)
    except ValueError as e:
        per = int(np.prod(x.shape[1:]))
        raise ValueError(f"shape={shape!r} is not compatible with the {what}: {len(x)} images of "
                         f"{per} values ({x.size} values in total)") from e


def validation_size(n_train: int, n_validation: int) -> int:
    """The number of trailing training images to hold out, clamped to ``n_train // 6``."""
    if n_validation < 0:
        raise ValueError(f"n_validation={n_validation} must be >= 0")
    if n_validation >= n_train:
        clamped = n_train // 6  # same 1/6 ratio as the real 10000 of 60000
        logger.warning("n_validation=%d >= %d training images; using the last %d as validation",
                       n_validation, n_train, clamped)
        return clamped
    return n_validation
