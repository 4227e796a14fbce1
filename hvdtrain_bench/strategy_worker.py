"""One task of a ``hvdtrain bench-backends`` job on a tf.distribute strategy:
``python -m hvdtrain_bench --worker --strategy S``.

It trains the benchmark MLP with ``Trainer(strategy=S)``: ``warmup`` untimed steps, then
``steps`` timed ones; asynchronous parameter-server steps are timed from the first
scheduled step to the join of the last one. The task that reports (the chief or the
coordinator) prints ``RESULT_MARKER`` and the JSON result, and writes it to ``--out``.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from hvdtrain_bench.jobs import write_result
from hvdtrain_bench.mlp import build_fn, make_data
from hvdtrain_bench.settings import LEARNING_RATE, add_worker_arguments, positive_int

STRATEGIES = ("mirrored", "multi_worker_mirrored", "parameter_server")
RESULT_MARKER = "HVDTRAIN_BACKEND_RESULT "


def run_strategy_worker(strategy: str, *, steps: int, warmup: int, batch_size: int,
                        examples: int, seed: int, world: int, devices: int = 1) -> dict | None:
    """One timed run of ``Trainer(strategy=strategy)``.

    Returns:
        The result on the task that reports (the chief / coordinator), else ``None``.

    Raises:
        RuntimeError: the Trainer has another number of workers than ``world``, or took
            another number of steps.
    """
    import hvdtrain

    if strategy in ("mirrored", "multi_worker_mirrored"):
        hvdtrain.get_strategy(strategy, devices=devices)  # before TensorFlow starts: devices
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    total = warmup + steps
    x, y = make_data(examples, seed, world, batch_size)
    trainer = hvdtrain.Trainer(tf.data.Dataset.from_tensor_slices((x, y)), build_fn,
                               keras.optimizers.SGD, {"learning_rate": LEARNING_RATE},
                               batch_size=batch_size, log_step_size=10**9, num_epochs=10**6,
                               max_iteration=total * world, strategy=strategy,
                               progress_bar=False)
    size = trainer.size
    if size != world:
        raise RuntimeError(f"asked for {world} workers, the {strategy} Trainer has {size}")
    for _ in range(warmup):
        trainer.train_on_batch()
    _wait(trainer)
    start = time.perf_counter()
    logs = None
    while not trainer.should_stop():
        logs = trainer.train_on_batch()
    _wait(trainer)
    elapsed = time.perf_counter() - start
    if trainer.global_step != total:
        raise RuntimeError(f"the Trainer took {trainer.global_step} steps, expected {total}")
    if trainer.rank != 0:
        return None
    loss = float(_value(logs["loss"])) if logs is not None else float("nan")
    return {"strategy": strategy, "workers": size, "steps": steps, "warmup": warmup,
            "batch_size": batch_size, "global_batch": batch_size * size, "elapsed_s": elapsed,
            "samples_per_s": batch_size * size * steps / elapsed, "final_loss": loss}


def _wait(trainer) -> None:
    """Blocks until the scheduled steps are done (parameter server) or the last step's
    values exist (synchronous strategies)."""
    join = getattr(trainer, "join", None)
    if callable(join):
        join()


def _value(tensor):
    fetch = getattr(tensor, "fetch", None)
    return fetch() if callable(fetch) else tensor


def strategy_worker_argv(strategy: str, cfg: dict, out: str, world: int,
                         devices: int = 1) -> list[str]:
    """The command of one task; ``cfg`` holds ``steps``, ``warmup``, ``batch_size``,
    ``examples`` and ``seed``."""
    return [sys.executable, "-m", "hvdtrain_bench", "--worker", "--strategy", strategy,
            "--steps", str(cfg["steps"]), "--warmup", str(cfg["warmup"]),
            "--batch-size", str(cfg["batch_size"]), "--examples", str(cfg["examples"]),
            "--seed", str(cfg["seed"]), "--devices", str(devices), "--world", str(world),
            "--out", out]


def worker_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m hvdtrain_bench --worker --strategy S`` (one task)."""
    p = argparse.ArgumentParser(prog="python -m hvdtrain_bench --worker --strategy S",
                                description="One timed run of Trainer(strategy=S) on this task.")
    p.add_argument("--strategy", choices=STRATEGIES, required=True)
    add_worker_arguments(p)
    p.add_argument("--devices", type=positive_int, default=1)
    p.add_argument("--world", type=positive_int, required=True)
    p.add_argument("--out", required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one task from its command line; returns the exit status."""
    args = worker_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    result = run_strategy_worker(args.strategy, steps=args.steps, warmup=args.warmup,
                                 batch_size=args.batch_size, examples=args.examples,
                                 seed=args.seed, world=args.world, devices=args.devices)
    if result is not None:
        write_result(result, args.out, RESULT_MARKER)
    return 0
