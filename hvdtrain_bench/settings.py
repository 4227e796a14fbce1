"""What both benchmarks share: the modes, the models' shapes, the defaults, and the
argparse types of their options. Imports nothing heavy."""
from __future__ import annotations

import argparse
from typing import Callable, NamedTuple, Sequence

#: What ``hvdtrain bench`` can time (see :mod:`hvdtrain_bench.worker`).
MODES = ("trainer", "plain", "pertensor", "fit", "mwms", "trainer_files")
DEFAULT_MODES = ("trainer", "plain", "pertensor", "mwms")
#: What a user writes by hand with stock settings: no hvdtrain defaults apply to them.
BASELINE_MODES = ("plain", "pertensor", "mwms")
#: Trainer / DistributedOptimizer options the bench can vary (``--compression`` etc.).
OPTION_KEYS = ("compression", "compression_ratio", "op", "backward_passes_per_step",
               "mixed_precision", "bucket_mb", "steps_per_execution", "jit_compile",
               "shard_optimizer")
LAUNCHERS = ("horovodrun", "mpirun")
#: (name, numerator mode, denominator mode) of the ratios the report gives per size.
RATIOS = (("trainer_over_plain", "trainer", "plain"),
          ("trainer_over_pertensor", "trainer", "pertensor"),
          ("trainer_over_mwms", "trainer", "mwms"),
          ("fit_over_trainer", "fit", "trainer"), ("fit_over_plain", "fit", "plain"),
          ("trainer_files_over_trainer", "trainer_files", "trainer"))

#: The driver passes the launch time (``time.time()``) so workers can time their start-up.
LAUNCHED_AT_ENV = "HVDTRAIN_BENCH_LAUNCHED_AT"
#: The prefix of the line a ``hvdtrain bench`` worker prints its result on.
RESULT_MARKER = "HVDTRAIN_BENCH_RESULT "

INPUT_DIM, HIDDEN, CLASSES = 784, 800, 10


class ModelSpec(NamedTuple):
    """A benchmark model: an MLP with these hidden widths (ReLU) and its title."""
    hidden: tuple[int, ...]
    title: str


#: The models ``hvdtrain bench --model`` can train; ``wide`` makes the gradient exchange
#: weigh more (14.2 M parameters, 57 MB of float32 gradients, against 1.3 M / 5.1 MB).
MODELS = {"mlp": ModelSpec((HIDDEN, HIDDEN), "MLP 784-800-800-10 (ReLU), SGD"),
          "wide": ModelSpec((2048,) * 4, "MLP 784-2048x4-10 (ReLU), SGD")}
DEFAULT_MODEL = "mlp"
MODEL = MODELS[DEFAULT_MODEL].title


def param_counts(model: str = DEFAULT_MODEL) -> tuple[int, ...]:
    """The sizes of ``model``'s weights and biases, layer by layer."""
    widths = (INPUT_DIM, *MODELS[model].hidden, CLASSES)
    return tuple(n for fan_in, fan_out in zip(widths, widths[1:])
                 for n in (fan_in * fan_out, fan_out))


#: The sizes of the default model's weights and biases, layer by layer.
PARAM_COUNTS = param_counts(DEFAULT_MODEL)
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


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """The options every benchmark worker takes (``--worker`` and how long it trains on
    what); the workers add their own."""
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS)
    p.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP)
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--examples", type=positive_int, default=DEFAULT_EXAMPLES)
    p.add_argument("--seed", type=non_negative_int, default=DEFAULT_SEED)


def check_job_arguments(launcher: str, modes: Sequence[str], models: Sequence[str], *,
                        allowed_modes: Sequence[str] = MODES, modes_note: str = "",
                        **positive: int) -> None:
    """Raises ValueError naming the first bad argument a bench command shares with the
    others: a positive integer in ``positive``, the launcher, the modes (from
    ``allowed_modes``; ``modes_note`` follows them in the message) or the models."""
    for name, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    bad = [m for m in modes if m not in allowed_modes]
    if bad or not modes:
        raise ValueError(f"modes must be drawn from {tuple(allowed_modes)}{modes_note}, "
                         f"got {list(modes)!r}")
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise ValueError(f"models must be drawn from {tuple(MODELS)}, got {list(models)!r}")
