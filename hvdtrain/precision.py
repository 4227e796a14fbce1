"""Mixed precision: which Keras dtype policy to build under, and checks that it took."""
from __future__ import annotations

import contextlib
from typing import Iterator

import keras

from hvdtrain.internals import keras_private

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def resolve(mixed_precision: str | bool | None) -> str:
    """The policy name to train with.

    ``None`` follows Keras's global policy (so ``keras.mixed_precision.set_global_policy``
    switches it on too); ``True`` means ``"mixed_float16"``; ``False`` means float32.

    Raises:
        ValueError: an unknown policy name.
    """
    if mixed_precision is None:
        name = keras.mixed_precision.global_policy().name
        return name if name in POLICIES else "float32"
    if mixed_precision is True:
        return "mixed_float16"
    if mixed_precision is False:
        return "float32"
    if isinstance(mixed_precision, str) and mixed_precision in POLICIES:
        return mixed_precision
    raise ValueError(f"mixed_precision must be one of {list(POLICIES)} (or True / False / None), "
                     f"got {mixed_precision!r}")


@contextlib.contextmanager
def policy_scope(name: str) -> Iterator[None]:
    """Makes ``name`` the global Keras policy while the user's network is built."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def check_model_uses(policy: str, model: keras.layers.Layer) -> None:
    """Checks that a network computes in ``policy``'s low precision with float32 variables.

    Raises:
        ValueError: no layer computes in the low precision (the model was built under
            another policy), or a trainable variable is not float32.
    """
    if policy == "float32":
        return
    low = "float16" if policy == "mixed_float16" else "bfloat16"
    layers = [layer for layer in keras_private.flatten_layers(model) if layer.weights]
    if not any(layer.compute_dtype == low for layer in layers):
        raise ValueError(
            f"mixed_precision={policy!r}, but no layer of the model computes in {low}: it was "
            f"built under another dtype policy. Build it after keras.mixed_precision."
            f"set_global_policy({policy!r}), or pass a build function (built under the policy)")
    wrong = [v.path for v in model.trainable_variables if v.dtype != "float32"]
    if wrong:
        raise ValueError(f"mixed_precision={policy!r} needs float32 variables, but these are not: "
                         f"{wrong[:5]}")
