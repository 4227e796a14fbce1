"""What every rank must agree on before training starts, checked in one collective.

Each rank describes its choices that decide which collectives run or how its gradients
are combined (batch size, step limits, reduction, precision, optimizer, validation, the
data's shape, ...). The descriptions are all-gathered once, first thing, and compared:
any difference fails on every rank within seconds, naming the setting and the ranks,
instead of hanging the job later or training silently wrong.

Horovod's idiom passes some settings on rank 0 only (``checkpoint_dir=d if hvd.rank() ==
0 else None``, ``callbacks=[cb] if hvd.rank() == 0 else []``, ``log_dir``): those are the
job's from rank 0 (checkpoints), or agreed so that one rank can decide for all (stopping
callbacks), and never compared.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

logger = logging.getLogger("hvdtrain")

#: Checkpoint settings that rank 0 acts on; every rank adopts rank 0's.
CHIEF_SETTINGS = {"checkpoint_dir": "directory", "save_checkpoint_steps": "every_steps",
                  "save_checkpoint_secs": "every_secs", "keep_checkpoint_max": "keep_max"}
#: Keys of a description that are not compared (decided as described above).
NOT_COMPARED = frozenset(CHIEF_SETTINGS) | {"can_stop"}


@dataclasses.dataclass(frozen=True)
class Agreed:
    """The outcome: rank 0's checkpoint settings, and whether any rank's callbacks may
    request a stop (then every rank agrees on stopping at every step)."""

    checkpoint: dict
    any_can_stop: bool


def stable(value: Any) -> Any:
    """A picklable description of ``value`` that is the same in every process for equal
    settings (no memory addresses): Keras objects by class and config, classes and
    functions by qualified name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): stable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [stable(v) for v in value]
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    get_config = getattr(value, "get_config", None)
    if callable(get_config):
        try:
            config = get_config()
        except Exception:  # noqa: BLE001 - an object whose config cannot be read
            config = None
        if isinstance(config, dict):
            config = {k: v for k, v in config.items() if k != "name"}
        return {"class": stable(type(value)), "config": stable(config)}
    text = repr(value)
    return text if " at 0x" not in text else stable(type(value))


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def differences(descriptions: Sequence[dict]) -> list[str]:
    """One line per compared setting whose value differs across ranks.

    Args:
        descriptions: every rank's description, in rank order.

    Returns:
        e.g. ``["batch_size differs across ranks: rank 0 has 32, rank 1 has 16"]``.
    """
    problems = []
    keys = sorted({k for d in descriptions for k in d} - NOT_COMPARED)
    for key in keys:
        groups: list[tuple[Any, list[int]]] = []
        for rank, description in enumerate(descriptions):
            value = description.get(key, "<not given>")
            for seen, ranks in groups:
                if seen == value:
                    ranks.append(rank)
                    break
            else:
                groups.append((value, [rank]))
        if len(groups) > 1:
            problems.append(f"{key} differs across ranks: " + ", ".join(
                f"{_ranks(ranks)} {'has' if len(ranks) == 1 else 'have'} {_show(value)}"
                for value, ranks in groups))
    chief_dir = descriptions[0].get("checkpoint_dir")
    others = [r for r, d in enumerate(descriptions) if d.get("checkpoint_dir") is not None]
    if chief_dir is None and others:
        problems.append(f"checkpoint_dir is set on {_ranks(others)} but not on rank 0: rank 0 "
                        "writes the job's checkpoints, so give it to rank 0 (Horovod's idiom: "
                        "checkpoint_dir=d if hvdtrain.rank() == 0 else None) or to every rank")
    return problems


def agree(mine: dict, allgather: Callable[[Any], list], rank: int) -> Agreed:
    """All-gathers every rank's description (one collective) and compares them.

    Args:
        mine: this rank's description (see :func:`stable` for the values).
        allgather: returns the list of every rank's object, in rank order.
        rank: this rank.

    Raises:
        ValueError: on every rank, naming each setting that differs and the ranks.
    """
    everyone = allgather(mine)
    problems = differences(everyone)
    if problems:
        raise ValueError("the ranks were started with different settings, so their collectives "
                         "would not match (a hang or silently wrong training): " +
                         "; ".join(problems) + ". Pass the same values on every rank")
    chief = everyone[0]
    if rank != 0 and mine.get("checkpoint_dir") not in (None, chief.get("checkpoint_dir")):
        logger.info("checkpoint_dir %r on rank %d is not used: rank 0 writes the job's "
                    "checkpoints to %r", mine["checkpoint_dir"], rank, chief["checkpoint_dir"])
    return Agreed(checkpoint={CHIEF_SETTINGS[k]: chief[k] for k in CHIEF_SETTINGS},
                  any_can_stop=any(d.get("can_stop") for d in everyone))


def describe(options, *, optimizer: Any, optimizer_args: dict | None, element_spec: Any,
             model_given: bool, validation: bool, validation_func: bool, can_stop: bool,
             mixed_precision: str | None, metrics: list = ()) -> dict:
    """This rank's description for :func:`agree`, from the Trainer's arguments.

    Args:
        options: the Trainer's :class:`hvdtrain.options.TrainerOptions`.
        optimizer, optimizer_args: as given to the Trainer.
        element_spec: the training dataset's element spec.
        model_given: ``model=`` was given (else a build function).
        validation, validation_func: a validation dataset / function was given.
        can_stop: some callback of this rank may request a stop.
        mixed_precision: the dtype policy the network is built under.
        metrics: ``(class, configuration)`` of each metric (their results are collectives
            at logging steps, so the metrics and ``log_step_size`` must agree).
    """
    d, c, lr, r = options.data, options.checkpoint, options.learning_rate, options.reduction
    return {
        "strategy": options.backend, "batch_size": d.batch_size, "num_epochs": d.num_epochs,
        "max_iteration": d.max_iteration, "shuffle": d.shuffle_buffer_size is not None,
        "lr_scaling": lr.rule, "warmup_steps": lr.warmup_steps, "warmup_epochs": lr.warmup_epochs,
        "compression": stable(r.compression), "compression_ratio": r.compression_ratio,
        "compression_rank": r.compression_rank,
        "op": stable(r.op.lower() if isinstance(r.op, str) else r.op),
        "backward_passes_per_step": r.backward_passes_per_step,
        "sparse_as_dense": r.sparse_as_dense, "nan_policy": r.nan_policy,
        "bucket_mb": r.bucket_mb, "steps_per_execution": options.steps_per_execution,
        "mixed_precision": mixed_precision, "model_parallel": stable(options.model_parallel),
        "jit_compile": options.jit_compile, "optimizer": stable(optimizer),
        "optimizer_args": stable(optimizer_args or {}), "model or build function":
            "model" if model_given else "build_training_func",
        "training_dataset element_spec": repr(element_spec),
        "validation_dataset": validation, "build_validation_func": validation_func,
        "checkpoint_dir": c.directory, "save_checkpoint_steps": c.every_steps,
        "save_checkpoint_secs": c.every_secs, "keep_checkpoint_max": c.keep_max,
        "can_stop": can_stop, "metrics": list(metrics),
        "log_step_size": options.logging.log_step_size,
    }
