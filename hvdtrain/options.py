"""The Trainer's options, grouped, validated in one place, and the one table of what each
backend supports.

TensorLayer's positional arguments and hvdtrain's keywords reach :func:`parse` unchanged;
it returns a :class:`TrainerOptions` of small frozen groups (data, checkpoints, logging,
learning rate, reduction) or raises an error that names the argument and what it expects.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import tensorflow as tf

from hvdtrain import reduction
from hvdtrain.checks import integer, is_number, positive_int, positive_number

#: The backend names ``Trainer(strategy=...)`` takes.
STRATEGIES = ("horovod", "mirrored", "multi_worker_mirrored", "parameter_server")
NAN_POLICIES = ("stop", "skip", "ignore")
#: Default size of a gradient bucket in MiB (Horovod; see
#: :mod:`hvdtrain.horovod.buckets`): the cost model fitted by ``hvdtrain bench``
#: keeps large rings, where each bucket pays the ring's latencies, near their best with it
#: (docs/performance.md); PyTorch DDP chose the same size.
DEFAULT_BUCKET_MB = 25.0
#: Default ``log_step_size``: logging reads the step's values back from the device (a sync
#: that stops the Python loop running ahead of it), so a default run does not log every step.
DEFAULT_LOG_STEP_SIZE = 100

_BACKEND_TITLES = {"horovod": "the Horovod backend", "mirrored": "MirroredStrategy",
                   "multi_worker_mirrored": "MultiWorkerMirroredStrategy",
                   "parameter_server": "parameter servers"}


def check_bucket_mb(value: Any) -> float:
    """``bucket_mb`` as a float if it is a number > 0 (``math.inf``: one bucket).

    Raises:
        ValueError: naming the value and what is expected.
    """
    return positive_number(value, "bucket_mb",
                           of="MiB (math.inf: one all-reduce of every gradient)")


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """How each rank reads its shard: batch size per rank (or replica), prefetching,
    passes over the data, shuffling, and TensorLayer's ``max_iteration`` (over all
    workers)."""

    batch_size: int = 32
    prefetch_size: int | None = None
    num_epochs: int = 1
    shuffle_buffer_size: int | None = None
    seed: int | None = None
    max_iteration: float = math.inf

    def __post_init__(self) -> None:
        positive_int(self.batch_size, "batch_size")
        positive_int(self.num_epochs, "num_epochs")
        integer(self.prefetch_size, "prefetch_size", minimum=0, optional=True)
        positive_number(self.max_iteration, "max_iteration")
        integer(self.seed, "seed", optional=True)

    def steps_per_worker(self, size: int) -> float:
        """TensorLayer's rule: each of ``size`` workers runs ``max_iteration // size`` steps."""
        return self.max_iteration // size if math.isfinite(self.max_iteration) else math.inf


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """Where and when rank 0 (the chief) saves, and how many checkpoints it keeps."""

    directory: str | None = None
    every_steps: int | None = None
    every_secs: float | None = 600
    keep_max: int = 5

    def __post_init__(self) -> None:
        integer(self.every_steps, "save_checkpoint_steps", minimum=1, optional=True)
        positive_int(self.keep_max, "keep_checkpoint_max")
        positive_number(self.every_secs, "save_checkpoint_secs", optional=True)


@dataclasses.dataclass(frozen=True)
class LoggingOptions:
    """What rank 0 reports: every ``log_step_size`` steps, TensorBoard scalars in
    ``log_dir``, a progress bar, Horovod's timeline."""

    log_step_size: int = DEFAULT_LOG_STEP_SIZE
    log_dir: str | None = None
    progress_bar: bool | None = None
    timeline: str | None = None

    def __post_init__(self) -> None:
        positive_int(self.log_step_size, "log_step_size")


@dataclasses.dataclass(frozen=True)
class LearningRateOptions:
    """The scaling rule for the world size and the warmup to the scaled rate."""

    rule: str = "linear"
    warmup_steps: int = 0
    warmup_epochs: float = 0

    def __post_init__(self) -> None:
        if self.rule not in ("linear", "sqrt", "none"):
            raise ValueError(f"lr scaling rule must be one of ('linear', 'sqrt', 'none'), got "
                             f"{self.rule!r}")
        if self.warmup_epochs and (not is_number(self.warmup_epochs) or self.warmup_epochs < 0):
            raise ValueError(f"warmup_epochs must be a number >= 0, got {self.warmup_epochs!r}")
        integer(self.warmup_steps, "warmup_steps", minimum=0)

    def warmup_in_steps(self, steps_per_epoch: int | None) -> int:
        """Warmup as a number of steps (``warmup_epochs`` needs a known epoch length)."""
        if not self.warmup_epochs:
            return self.warmup_steps
        if not steps_per_epoch or steps_per_epoch < 0:
            raise ValueError("warmup_epochs needs a training_dataset of known, finite length; "
                             "use warmup_steps instead")
        return max(1, int(round(self.warmup_epochs * steps_per_epoch)))


@dataclasses.dataclass(frozen=True)
class ReductionOptions:
    """How gradients are exchanged (Horovod): compression, op, local accumulation, and
    what happens when a rank's loss is not finite; every setting checked here, before
    Horovod starts (the Trainer's and ``DistributedOptimizer``'s alike)."""

    compression: Any = None
    compression_ratio: float | None = None
    op: Any = "average"
    backward_passes_per_step: int = 1
    sparse_as_dense: bool = False
    nan_policy: str = "stop"
    bucket_mb: float = DEFAULT_BUCKET_MB
    compression_rank: int | None = None
    shard_optimizer: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.shard_optimizer, bool):
            raise ValueError(f"shard_optimizer must be True or False, got "
                             f"{self.shard_optimizer!r}")
        reduction.check_op(self.op)
        reduction.check_compression(self.compression, self.compression_ratio,
                                    self.compression_rank)
        reduction.check_backward_passes(self.backward_passes_per_step)
        check_bucket_mb(self.bucket_mb)
        if self.nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy must be 'stop', 'skip' or 'ignore', got "
                             f"{self.nan_policy!r}")


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """Parameter-server clusters: the task (default: from the environment) and how long
    to wait for the other tasks' servers."""

    task_spec: Any = None
    connect_timeout: float = 300.0

    def __post_init__(self) -> None:
        positive_number(self.connect_timeout, "connect_timeout")


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
    """Every option of a Trainer, grouped. ``backend`` is the strategy's name."""

    strategy: Any  # the backend's name or the tf.distribute.Strategy given
    backend: str
    data: DataOptions
    checkpoint: CheckpointOptions
    logging: LoggingOptions
    learning_rate: LearningRateOptions
    reduction: ReductionOptions
    cluster: ClusterOptions
    mixed_precision: Any = None
    model_parallel: Any = None
    jit_compile: bool = False
    steps_per_execution: int = 1


#: Options that only some backends implement: ``name -> (default, backends)``, the
#: defaults read from the option groups above. Any other value than the default on another
#: backend is refused, with the same message everywhere.
BACKEND_ONLY: dict[str, tuple[Any, frozenset]] = {
    name: (default, frozenset(backends)) for name, default, backends in (
        *((name, getattr(ReductionOptions, name), {"horovod"}) for name in (
            "compression", "compression_ratio", "compression_rank", "op",
            "backward_passes_per_step",
            "sparse_as_dense", "nan_policy", "shard_optimizer")),
        ("timeline", LoggingOptions.timeline, {"horovod"}),
        *((name, getattr(TrainerOptions, name), {"horovod"}) for name in (
            "mixed_precision", "model_parallel", "jit_compile", "steps_per_execution")),
        ("bucket_mb", None, {"horovod"}),  # None: DEFAULT_BUCKET_MB
        ("task_spec", ClusterOptions.task_spec, {"parameter_server"}),
        ("connect_timeout", ClusterOptions.connect_timeout, {"parameter_server"}),
    )}


def _settings_class(name: str, backend: str, doc: str) -> type:
    """A frozen dataclass of ``backend``'s settings: its fields and defaults are the rows of
    :data:`BACKEND_ONLY` for that backend (one table, so the defaults cannot drift), and
    it is checked when made by :func:`parse`, the one validation."""
    fields = [(option, Any, dataclasses.field(default=default))
              for option, (default, backends) in BACKEND_ONLY.items() if backend in backends]
    return dataclasses.make_dataclass(
        name, fields, frozen=True,
        namespace={"backend": backend, "__doc__": doc, "__module__": __name__,
                   "__post_init__": _check_settings})


def _check_settings(settings) -> None:
    parse(settings)


Horovod = _settings_class("Horovod", "horovod", """\
``Trainer(strategy=hvdtrain.Horovod(...))``: the Horovod backend with its own settings,
grouped where they belong (the same names also work as ``Trainer`` keywords, for
TensorLayer's callers; a setting given both ways is refused).

Args:
    compression, compression_ratio, compression_rank, op, backward_passes_per_step,
    sparse_as_dense: Horovod's reduction (see :func:`hvdtrain.DistributedOptimizer`).
    nan_policy: ``"stop"``, ``"skip"`` or ``"ignore"`` a step whose loss is not finite.
    shard_optimizer: shard the optimizer state over the ranks (ZeRO-1; element-wise
        optimizers, see :func:`hvdtrain.DistributedOptimizer`).
    timeline: write Horovod's timeline to this file.
    mixed_precision: the dtype policy (``None``: Keras's global one).
    model_parallel: split ``model=`` over this rank's devices.
    jit_compile: XLA compiles the forward and backward pass.
    bucket_mb: gradients all-reduced in buckets of about this many MiB (default 25).
    steps_per_execution: steps per call of the compiled step.

Raises:
    ValueError: a bad value, named (checked when it is made).
""")
ParameterServer = _settings_class("ParameterServer", "parameter_server", """\
``Trainer(strategy=hvdtrain.ParameterServer(task_spec=..., connect_timeout=...))``:
parameter servers with their settings (see :class:`ClusterOptions`; also keywords).
""")


#: The backend settings objects ``Trainer(strategy=...)`` takes.
BACKEND_SETTINGS = (Horovod, ParameterServer)


def _settings_given(strategy: Any, keywords: dict) -> tuple[Any, dict]:
    """A settings object's backend name and its non-default settings merged with the
    same settings given as keywords (which must not repeat one)."""
    if not isinstance(strategy, BACKEND_SETTINGS):
        return strategy, keywords
    settings = {f.name: getattr(strategy, f.name) for f in dataclasses.fields(strategy)
                if getattr(strategy, f.name) != f.default}
    twice = sorted(name for name, value in keywords.items()
                   if name in settings and value != BACKEND_ONLY[name][0])
    if twice:
        raise TypeError(f"{', '.join(twice)} given both in strategy="
                        f"{type(strategy).__name__}(...) and as Trainer keyword(s): give "
                        "each setting once")
    return strategy.backend, {**keywords, **settings}


def backend_name(strategy: Any) -> str:
    """The backend of ``strategy``: one of :data:`STRATEGIES` (a ``tf.distribute.Strategy``
    instance maps to its kind).

    Raises:
        ValueError: an unknown name.
        TypeError: neither a name nor a strategy.
    """
    if isinstance(strategy, str):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))} or a "
                             f"tf.distribute.Strategy, got {strategy!r}")
        return strategy
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a name or a tf.distribute.Strategy, got "
                        f"{type(strategy).__name__}")
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return "parameter_server"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker_mirrored"
    return "mirrored"


def check_supported(backend: str, given: dict) -> None:
    """Refuses options that ``backend`` does not implement, naming them.

    Args:
        backend: one of :data:`STRATEGIES`.
        given: option name -> value, for the names in :data:`BACKEND_ONLY`.

    Raises:
        ValueError: ``"<names> only work(s) with strategy='<backend>' (...)"``.
    """
    bad: dict = {}
    for name, value in given.items():
        default, backends = BACKEND_ONLY[name]
        if backend not in backends and value != default:
            bad.setdefault(backends, []).append(name)
    for backends, names in bad.items():
        where = " or ".join(f"strategy={b!r} ({_BACKEND_TITLES[b]})" for b in sorted(backends))
        raise ValueError(f"{', '.join(sorted(names))} only work(s) with {where}; "
                         f"strategy={backend!r} does not support them: leave them at their "
                         "defaults")


def parse(strategy: Any = "horovod", *, batch_size: int = DataOptions.batch_size,
          prefetch_size: int | None = DataOptions.prefetch_size,
          num_epochs: int = DataOptions.num_epochs,
          shuffle_buffer_size: int | None = DataOptions.shuffle_buffer_size,
          seed: int | None = DataOptions.seed, max_iteration: float = DataOptions.max_iteration,
          checkpoint_dir: str | None = CheckpointOptions.directory,
          save_checkpoint_steps: int | None = CheckpointOptions.every_steps,
          save_checkpoint_secs: float | None = CheckpointOptions.every_secs,
          keep_checkpoint_max: int = CheckpointOptions.keep_max,
          log_step_size: int = LoggingOptions.log_step_size,
          log_dir: str | None = LoggingOptions.log_dir,
          progress_bar: bool | None = LoggingOptions.progress_bar,
          scaling_learning_rate: bool = True, lr_scaling: str = LearningRateOptions.rule,
          warmup_steps: int = LearningRateOptions.warmup_steps,
          warmup_epochs: float = LearningRateOptions.warmup_epochs,
          **backend_only: Any) -> TrainerOptions:
    """Validates the Trainer's keyword arguments and groups them. ``strategy`` is a
    backend's name, a ``tf.distribute.Strategy``, or a settings object
    (:class:`Horovod`, :class:`ParameterServer`) whose settings join the keywords.

    Raises:
        ValueError, TypeError: naming the first bad argument and what it expects.
    """
    unknown = sorted(set(backend_only) - set(BACKEND_ONLY))
    if unknown:
        raise TypeError(f"Trainer got unexpected argument(s) {unknown}")
    strategy, backend_only = _settings_given(strategy, backend_only)
    backend = backend_name(strategy)
    check_supported(backend, backend_only)
    get = lambda name: backend_only.get(name, BACKEND_ONLY[name][0])  # noqa: E731
    return TrainerOptions(
        strategy=strategy, backend=backend,
        data=DataOptions(batch_size, prefetch_size, num_epochs, shuffle_buffer_size, seed,
                         max_iteration),
        checkpoint=CheckpointOptions(checkpoint_dir, save_checkpoint_steps, save_checkpoint_secs,
                                     keep_checkpoint_max),
        logging=LoggingOptions(log_step_size, log_dir, progress_bar, get("timeline")),
        learning_rate=LearningRateOptions(lr_scaling if scaling_learning_rate else "none",
                                          warmup_steps, warmup_epochs),
        reduction=ReductionOptions(get("compression"), get("compression_ratio"), get("op"),
                                   get("backward_passes_per_step"), get("sparse_as_dense"),
                                   get("nan_policy"),
                                   DEFAULT_BUCKET_MB if get("bucket_mb") is None
                                   else get("bucket_mb"),
                                   compression_rank=get("compression_rank"),
                                   shard_optimizer=get("shard_optimizer")),
        cluster=ClusterOptions(get("task_spec"), get("connect_timeout")),
        mixed_precision=get("mixed_precision"), model_parallel=get("model_parallel"),
        jit_compile=_jit_compile(get("jit_compile"), get("model_parallel")),
        steps_per_execution=positive_int(get("steps_per_execution"), "steps_per_execution"))


def _jit_compile(value: Any, model_parallel: Any) -> bool:
    """``jit_compile``: a bool; XLA compiles one device's step, not a model split over
    several (``model_parallel``)."""
    if not isinstance(value, bool):
        raise ValueError(f"jit_compile must be True or False, got {value!r}")
    if value and model_parallel is not None:
        raise ValueError("jit_compile=True works on one device per rank; it cannot be combined "
                         "with model_parallel")
    return value
