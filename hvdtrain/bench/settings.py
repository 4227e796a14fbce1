"""What both benchmarks share: the modes, the model's shape, the defaults, and the
argparse types of their options. Imports nothing heavy."""
from __future__ import annotations

import argparse
from typing import Callable

#: What ``hvdtrain bench`` can time (see :mod:`hvdtrain.bench.worker`).
MODES = ("trainer", "plain", "fit", "mwms", "trainer_files")
DEFAULT_MODES = ("trainer", "plain", "mwms")
#: What a user writes by hand with stock settings: no hvdtrain defaults apply to them.
BASELINE_MODES = ("plain", "mwms")
#: Trainer / DistributedOptimizer options the bench can vary (``--compression`` etc.).
OPTION_KEYS = ("compression", "compression_ratio", "op", "backward_passes_per_step",
               "mixed_precision")
LAUNCHERS = ("horovodrun", "mpirun")
#: (name, numerator mode, denominator mode) of the ratios the report gives per size.
RATIOS = (("trainer_over_plain", "trainer", "plain"), ("trainer_over_mwms", "trainer", "mwms"),
          ("fit_over_trainer", "fit", "trainer"), ("fit_over_plain", "fit", "plain"),
          ("trainer_files_over_trainer", "trainer_files", "trainer"))

#: The driver passes the launch time (``time.time()``) so workers can time their start-up.
LAUNCHED_AT_ENV = "HVDTRAIN_BENCH_LAUNCHED_AT"
#: The prefix of the line a ``hvdtrain bench`` worker prints its result on.
RESULT_MARKER = "HVDTRAIN_BENCH_RESULT "

MODEL = "MLP 784-800-800-10 (ReLU), SGD"
INPUT_DIM, HIDDEN, CLASSES = 784, 800, 10
#: The sizes of the model's weights and biases, layer by layer.
PARAM_COUNTS = (INPUT_DIM * HIDDEN, HIDDEN, HIDDEN * HIDDEN, HIDDEN, HIDDEN * CLASSES, CLASSES)
LEARNING_RATE = 0.01

DEFAULT_STEPS = 200
DEFAULT_WARMUP = 10
DEFAULT_BATCH_SIZE = 128
DEFAULT_EXAMPLES = 8192
DEFAULT_REPEATS = 3
DEFAULT_SEED = 0
DEFAULT_TIMEOUT = 300.0


def number_parser(cast: Callable, accept: Callable, what: str) -> Callable[[str], object]:
    """An argparse ``type`` that casts with ``cast`` and keeps the values ``accept`` allows.

    Args:
        cast: e.g. ``int``; a ``ValueError`` from it becomes an argparse error.
        accept: returns whether a cast value is allowed.
        what: the allowed values in words, for the error message.
    """
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return parse


positive_int = number_parser(int, lambda v: v > 0, "a positive integer")
non_negative_int = number_parser(int, lambda v: v >= 0, "an integer >= 0")
positive_float = number_parser(float, lambda v: v > 0, "a positive number")
