"""``model.fit``'s epochs end at the same step on every rank, however uneven the data.

Ranks that hold different amounts of data (per-file shards, a filtered dataset) would
otherwise run different numbers of steps: the rank that runs out moves on to its epoch's
end while the others wait in the next step's gradient exchange, and the job hangs.

Here every epoch ends where the first rank runs out, as if every rank's data had been cut
to the shortest by hand. Each rank reads one batch ahead, so it knows when it hands in its
last batch; that flag rides in the step's first gradient bucket
(a :class:`hvdtrain.horovod.exchange.Rider`: no collective of its own), every rank applies the
step, and the ranks that had more data end their epoch there too. When that happens, rank
0 logs how many batches and examples each rank trained and which ranks left data out.
Known and unknown cardinality, numpy arrays and ``tf.data`` alike; ``steps_per_execution``
runs its steps one by one here, so an epoch can end between them.
"""
from __future__ import annotations

import logging
import warnings

import tensorflow as tf

from hvdtrain.horovod import collectives, finite, watchdog

logger = logging.getLogger("hvdtrain")

# Keras warns so when a train function ends an epoch before the count it knows; here that
# is the agreed end, which the log line explains.
_KERAS_RAN_OUT = "Your input ran out of data"


class EvenEpochs:
    """Wraps Keras's train function: feeds it one batch at a time, read one ahead, and ends
    the epoch on every rank at the step where the first rank hands in its last batch."""

    def __init__(self, model, function) -> None:
        self._model, self._function = model, function
        with tf.init_scope():
            self.last_batch = tf.Variable(0.0, trainable=False, name="hvd_last_batch")
            self.ranks_done = tf.Variable(0.0, trainable=False, name="hvd_ranks_done")
        self._iterator = None
        self._next = None
        self._ended = False
        self._batches = self._examples = 0
        self._step = self._epoch = 0
        self._warned = False
        self._more = True

    def riders_sum(self, sums) -> None:
        """Receives, inside the traced step, the number of ranks handing in their last
        batch this step."""
        self.ranks_done.assign(sums[0])

    def __call__(self, iterator):
        if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return self._function(iterator)
        if iterator is not self._iterator:  # a new epoch (or Keras restarted the data)
            self._iterator, self._next, self._ended = iterator, None, False
            self._batches = self._examples = 0
            self._epoch += 1
        if self._ended:
            raise StopIteration
        logs = None
        for _ in range(max(1, int(self._model.steps_per_execution))):
            logs = self._one_step(iterator)
            if self._ended:
                break
        return logs

    def _one_step(self, iterator):
        current = self._next if self._next is not None else iterator.get_next_as_optional()
        if not current.has_value():
            raise ValueError(
                f"rank {collectives.rank()} has no batch for this epoch of fit, so it cannot "
                "take part in the other ranks' steps: give every rank at least one batch "
                "(fewer ranks, or a smaller batch_size)")
        self._next = iterator.get_next_as_optional()
        last = not self._next.has_value()
        self._more = not last
        batch = current.get_value()
        self.last_batch.assign(1.0 if last else 0.0)
        self._step += 1
        with watchdog.waiting(f"fit training step {self._step}", step=self._step):
            try:
                logs = self._function(iter([batch]))
            except tf.errors.InvalidArgumentError as error:  # the optimizer's check
                message = finite.message_of(error)
                if message is None:
                    raise
                raise FloatingPointError(f"{message}; it was batch {self._batches + 1} of "
                                         f"epoch {self._epoch} on each rank") from None
            done = int(round(float(self.ranks_done.numpy())))
        self._batches += 1
        self._examples += _examples_in(batch)
        if done:
            self._ended = True
            if done < collectives.size():
                self._report_uneven()
        return logs

    def _report_uneven(self) -> None:
        """Every rank ended its epoch early or on time at the same step: one gather (all
        ranks know it happened) and a log line on rank 0."""
        warnings.filterwarnings("ignore", message=_KERAS_RAN_OUT)
        mine = (self._batches, self._examples, self._more)
        every = collectives.allgather_object(mine)
        if collectives.rank() != 0:
            return
        ran_out = [r for r, (_, _, more) in enumerate(every) if not more]
        left = [r for r, (_, _, more) in enumerate(every) if more]
        trained = ", ".join(f"rank {r}: {b} batches, {e} examples"
                            for r, (b, e, _) in enumerate(every))
        log = logger.info if self._warned else logger.warning
        self._warned = True
        log("fit: uneven data across ranks: the epoch ended after %d steps, where %s ran out "
            "of data; %s left the rest of its data out of this epoch (%s). Every rank runs "
            "the same steps, as if the data were cut to the shortest rank's; balance the "
            "shards to use all of it", self._batches, _ranks(ran_out), _ranks(left), trained)


def _examples_in(batch) -> int:
    first = tf.nest.flatten(batch)[0]
    return int(first.shape[0]) if first.shape.rank else 1


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
