"""The Horovod backend: one process per rank, gradients all-reduced by Horovod.

Every rank reads its shard, computes its gradients and reduces them in one fused
all-reduce (the loss rides along, so a NaN on any rank is seen by all); rank 0 writes the
checkpoints and every rank starts from its state.
"""
from __future__ import annotations

import logging
import tensorflow as tf

from hvdtrain import data, precision
from hvdtrain import program as programs
from hvdtrain.backends.base import Backend
from hvdtrain.horovod import accumulated_state, buckets, collectives, exchange, finite, hybrid
from hvdtrain.horovod import runtime, sharded_state, step_status, watchdog
from hvdtrain.horovod import step as horovod_step
from hvdtrain.horovod import optimizer as distributed
from hvdtrain.checkpoint import Checkpointer
from hvdtrain.internals import keras_private

logger = logging.getLogger("hvdtrain")


class HorovodBackend(Backend):
    """Data parallelism over Horovod ranks (``horovodrun`` / ``mpirun``).

    Args:
        options: the Trainer's :class:`hvdtrain.options.TrainerOptions`.
    """

    name = "horovod"

    def __init__(self, options) -> None:
        self._model_parallel = hybrid.resolve(options.model_parallel)
        timeline = options.logging.timeline
        collectives.init(gpus_per_rank=hybrid.gpus_per_rank(self._model_parallel),
                         timeline=bool(timeline))
        if timeline:
            collectives.check_timeline_possible(timeline)
        self._timeline = timeline
        self._reduction = options.reduction
        self.nan_policy = options.reduction.nan_policy
        self._status = None
        self._strategy = None  # the exchange strategy, once the checkpointer is made
        self.mixed_precision = precision.resolve(options.mixed_precision)
        self._loss_scaled = self.mixed_precision == "mixed_float16"
        self._jit_compile = options.jit_compile
        self.refresh_membership()

    def describe(self) -> str:
        """The ranks, and whether Horovod can reduce on GPUs (NCCL) or goes through the host."""
        gpus = len(tf.config.get_visible_devices("GPU"))
        job = runtime.job_label()
        return (f"{super().describe()}{f' (a sub-communicator: {job})' if job else ''}, "
                f"{gpus} GPU(s) visible to rank 0; {runtime.build_summary()}")

    def refresh_membership(self) -> None:
        self.rank, self.size = collectives.rank(), collectives.size()
        self.num_workers = self.size

    # ------------------------------------------------------------------ collectives
    def agree_any(self, flag: bool) -> bool:
        return collectives.agree_any(flag)

    def allgather_object(self, obj) -> list:
        return collectives.allgather_object(obj)

    def sum_over_workers(self, values: dict) -> dict:
        return collectives.allreduce_dict(values, weight=None)

    # ------------------------------------------------------------------ building
    def build_program(self, build_training_func, model, loss, element_spec) -> tuple:
        with precision.policy_scope(self.mixed_precision):
            if self._model_parallel is not None:
                network, program = hybrid.model_program(model, loss, element_spec,
                                                        self._model_parallel, build_training_func)
            else:
                network, program = super().build_program(build_training_func, model, loss,
                                                         element_spec)
        precision.check_model_uses(self.mixed_precision, network)
        return network, program

    def distribute_optimizer(self, optimizer):
        """The optimizer ``fit`` would get: under ``mixed_float16`` the same wrapper puts
        the loss scaler around the exchange (one place for both front doors)."""
        r = self._reduction
        with precision.policy_scope(self.mixed_precision):
            return distributed.DistributedOptimizer(
                optimizer, compression=r.compression, op=r.op,
                backward_passes_per_step=r.backward_passes_per_step,
                sparse_as_dense=r.sparse_as_dense, compression_ratio=r.compression_ratio,
                compression_rank=r.compression_rank, bucket_mb=r.bucket_mb,
                shard_optimizer=r.shard_optimizer, nan_policy=r.nan_policy)

    def after_build(self, program, optimizer) -> None:
        if self.rank == 0:  # once at start: what the optimizer holds on each rank
            logger.info("%s", sharded_state.describe_state(optimizer))

    # ------------------------------------------------------------------ data
    def setup_data(self, dataset, options) -> int | None:
        self._data = options
        self._train_ds = data.shard_and_batch(
            dataset, num_shards=self.size, index=self.rank, batch_size=options.batch_size,
            prefetch_size=0, shuffle_buffer_size=options.shuffle_buffer_size, seed=options.seed)
        steps = data.smallest_steps(collectives.allgather_object(data.known_steps(self._train_ds)))
        if steps == 0:
            raise ValueError("training_dataset is empty on at least one rank: it needs at least "
                             f"{self.size} examples for {self.size} ranks")
        self._steps_per_epoch = steps
        return steps

    def open_iterator(self, epoch: int, skip: int, num_epochs: int):
        """One iterator over every remaining epoch (see :func:`hvdtrain.data.resume`)."""
        ds = data.resume(self._train_ds, steps_per_epoch=self._steps_per_epoch,
                         num_epochs=num_epochs, epoch=epoch, skip=skip,
                         shuffled=bool(self._data.shuffle_buffer_size))
        return iter(data.prefetch(ds, self._data.prefetch_size))

    def next_agreed(self, iterator):
        opt = iterator.get_next_as_optional()
        if collectives.agree_any(not bool(opt.has_value())):
            return None
        return opt.get_value()

    # ------------------------------------------------------------------ steps
    def make_train_step(self, program, optimizer, step):
        trainable = program.trainable_variables
        nan_policy, loss_scaled = self.nan_policy, self._loss_scaled
        status = self._status = step_status.StepStatus(self.rank, nan_policy,
                                                       collectives.allgather_object,
                                                       where=self._batch_position)
        exchanger = distributed.exchanger_of(optimizer)
        # The exchange here, before apply, unless the optimizer must reduce inside it
        # (after local accumulation, under the loss scaler, or compressed).
        before_apply = distributed.reduces_before_apply(optimizer)
        if self.rank == 0 and self.size > 1:
            plan = exchanger.plan(trainable)
            if plan is not None:
                logger.info("gradient exchange: %s", buckets.describe(trainable, plan))

        def forward_backward(x, y):
            with hybrid.tape_for(program) as tape:  # staged: backward stage by stage
                outs = program([x, y], training=True)
                loss = programs.total_loss(program, outs)
                if loss_scaled:
                    loss = optimizer.scale_loss(loss)
            return outs, tape.gradient(loss, trainable)

        if self._jit_compile:  # XLA compiles the pass; the exchange stays outside it
            forward_backward = horovod_step.compile_pass(forward_backward, program.name)

        def one_step(x, y, stop):
            outs, grads = forward_backward(x, y)
            local_loss = tf.cast(outs[programs.LOSS_KEY], tf.float32)
            # The loss and ``stop`` (1.0 on a rank asked to stop: preemption) ride in the
            # first gradient bucket, so every rank learns of them after the same step.
            riders = [exchange.Rider(local_loss), exchange.Rider(stop, exact=True)]
            # so does this rank's "my gradients are not all finite" (hvdtrain.horovod.finite;
            # not under the loss scaler, whose signal they are, nor when the optimizer
            # reduces inside apply: it checks them there itself)
            checked = before_apply and nan_policy != "ignore" and not loss_scaled
            grad_flag = finite.local_flag(grads) if checked else tf.constant(0.0)
            riders += [exchange.Rider(grad_flag, exact=True)] if checked else []
            if before_apply:
                grads, (loss_sum, stop_sum, *bad_sum) = exchanger.reduce(grads, trainable, riders)
            else:  # the optimizer's exchanger reduces inside apply; the riders go alone
                _, (loss_sum, stop_sum) = exchanger.reduce([], None, riders)
                bad_sum = []
            stopping = stop_sum > 0
            grads_finite = bad_sum[0] < 0.5 if bad_sum else tf.constant(True)
            if nan_policy == "ignore" or loss_scaled:  # the loss scaler skips overflows
                distributed.apply(optimizer, grads, trainable, reduced=before_apply)
                mean_finite = tf.constant(True) if nan_policy == "ignore" else (
                    tf.math.is_finite(loss_sum))
            else:
                # If any rank's loss or gradients are NaN or Inf, every rank sees it in
                # the summed loss or count and skips the update.
                mean_finite = tf.logical_and(tf.math.is_finite(loss_sum), grads_finite)

                def apply():
                    distributed.apply(optimizer, grads, trainable, reduced=before_apply)
                    return tf.constant(True)

                tf.cond(tf.logical_and(mean_finite, tf.logical_not(status.halted())), apply,
                        lambda: tf.constant(False))
            taken = step.assign_add(1)
            status.record(taken, mean_finite, tf.math.is_finite(local_loss), stopping,
                          grad_flag < 0.5)
            return outs

        def steps_fn(batches, stop):
            """``k`` steps in one call; returns the mean of their logs (one step: its logs)."""
            totals = None
            for x, y in batches:  # automatic control dependencies keep the steps in order
                outs = one_step(x, y, stop)
                totals = outs if totals is None else {k: totals[k] + outs[k] for k in outs}
            k = len(batches)
            return totals if k == 1 else {name: v / k for name, v in totals.items()}

        compiled = tf.function(steps_fn)
        no_stop, stop = tf.constant(0.0), tf.constant(1.0)

        def run(batch, global_step: int) -> dict:
            """Runs one step, or one per batch of a list (the last numbered
            ``global_step``), without reading anything back from the device."""
            batches = tuple(batch) if isinstance(batch, list) else (batch,)
            request = self.stop_request is not None and self.stop_request.requested
            with watchdog.waiting(f"training step {global_step}", step=global_step):
                return compiled(batches, stop if request else no_stop)

        run.compiled = compiled  # the tf.function, for looking at its graph
        return run

    def _batch_position(self, step: int) -> str:
        """Where step ``step`` (1 = the first) took its batch in each rank's epoch."""
        spe = self._steps_per_epoch
        if not spe or spe < 0:
            return f" (batch {step} of each rank's shard)"
        return f" (epoch {(step - 1) // spe + 1}, batch {(step - 1) % spe + 1} of each rank's shard)"

    def settle(self, global_step: int) -> None:
        """Reads what the steps since the last call decided (one device read)."""
        with watchdog.waiting(f"training step {global_step}", step=global_step):
            self._status.settle()

    def preemption_agreed(self) -> bool:
        return self._status.stop_agreed  # as of the last settle()

    @property
    def skipped_steps(self) -> int:
        return self._status.skipped_steps if self._status is not None else 0

    # ------------------------------------------------------------------ state
    def checkpointer(self, options, **objects) -> Checkpointer:
        strategy = self._strategy = distributed.exchanger_of(objects["optimizer"]).strategy
        if (strategy.keeps_gradients and not strategy.saves_state and options.directory
                and self.rank == 0):
            logger.warning("compression=%r keeps part of each gradient for later steps (error "
                           "feedback), which checkpoints do not hold: a resumed run starts "
                           "that part from zero (not an exact resume)", strategy.name)
        return _WatchedCheckpointer(options.directory, collectives=collectives, keep_max=options.keep_max,
                            every_steps=options.every_steps, every_secs=options.every_secs,
                            rng=keras_private.seed_generator_states(objects["model"]),
                            state=accumulated_state.checkpoint_state(
                                strategy, objects["optimizer"]), **objects)

    def share_start_state(self, variables, program) -> None:
        """Broadcasts rank 0's state (with the exchange strategy's own, but not what each
        rank holds alone by design), then gives every rank its own dropout stream,
        deterministically, so a resumed run draws the same masks as an uninterrupted one."""
        strategy = self._strategy
        if strategy is None:
            horovod_step.broadcast_start(variables)
        else:
            horovod_step.broadcast_start(list(variables) + strategy.start_variables(),
                                         exclude=strategy.local_variables())
        if self.rank:
            for state in keras_private.seed_generator_states(program):
                state.assign_add(tf.constant([self.rank * 1_000_003, 0], dtype=state.dtype))

    # ------------------------------------------------------------------ run
    def on_train_begin(self) -> None:
        if self._timeline:
            collectives.start_timeline(self._timeline)
            self._timeline_running = True

    def on_train_end(self, global_step: int) -> None:
        if getattr(self, "_timeline_running", False):
            collectives.stop_timeline()
            self._timeline_running = False


class _WatchedCheckpointer(Checkpointer):
    """Tells the collective watchdog that rank 0 is saving (the others wait for it in the
    next step; that is no hang)."""

    def save(self, step: int, **meta) -> str | None:
        with watchdog.busy("saving a checkpoint"):
            return super().save(step, **meta)
