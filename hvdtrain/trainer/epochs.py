"""Batches through the epochs for the Trainer's loop: where a resumed run continues, when
an epoch ends, and the epoch callbacks, over a backend's iterators."""
from __future__ import annotations

from typing import Any, Callable


class EpochFeed:
    """Hands out the next batch every worker has, moving through ``num_epochs`` passes.

    Args:
        backend: opens iterators (:meth:`hvdtrain.backends.base.Backend.open_iterator`)
            and, for data of unknown length, agrees on its end (``next_agreed``).
        callbacks: gets ``on_epoch_begin`` / ``on_epoch_end``.
        num_epochs: passes over the data.
        last_logs: returns the ending epoch's logs (for ``on_epoch_end``), as floats.
        stop_requested: asked after each ``on_epoch_end`` (a callback such as Keras's
            ``EarlyStopping`` may have asked to stop there); True ends the data before the
            next epoch begins.
    """

    def __init__(self, backend, callbacks, num_epochs: int, last_logs: Callable[[], dict],
                 stop_requested: Callable[[], bool] = lambda: False) -> None:
        self._backend, self._callbacks = backend, callbacks
        self._num_epochs, self._last_logs = num_epochs, last_logs
        self._stop_requested = stop_requested
        self._iterator = self._spent_iterator = None
        self.epoch, self.epoch_step, self._skip = -1, 0, 0
        self.steps_per_epoch: int | None = None

    def seek(self, steps_per_epoch: int | None, global_step: int) -> None:
        """Continue from ``global_step`` (dropping any open iterator): epoch and batches
        to skip. ``steps_per_epoch`` as in :meth:`Backend.setup_data`."""
        self.steps_per_epoch, self._iterator = steps_per_epoch, None
        if steps_per_epoch and steps_per_epoch > 0:
            self.epoch = global_step // steps_per_epoch - 1
            self._skip = global_step % steps_per_epoch
        else:
            self.epoch, self._skip = -1, 0

    def step_taken(self) -> None:
        """Counts a trained batch toward the current epoch."""
        self.epoch_step += 1

    def next_batch(self) -> Any:
        """The next batch, or ``None`` once the last epoch ended (for unknown lengths a
        collective: call it on every worker)."""
        spe = self.steps_per_epoch
        while True:
            if self._iterator is None:
                if self.epoch + 1 >= self._num_epochs and spe != -1:
                    return None
                self.epoch += 1
                self._iterator = self._backend.open_iterator(self.epoch, self._skip,
                                                             self._num_epochs)
                self.epoch_step, self._skip = self._skip, 0
                self._callbacks.call("on_epoch_begin", self.epoch, {})
            elif spe and spe > 0 and self.epoch_step >= spe:  # an epoch ends mid-iterator
                self._callbacks.call("on_epoch_end", self.epoch, self._last_logs())
                if self.epoch + 1 >= self._num_epochs or self._stop_requested():
                    self._iterator = None
                    return None
                self.epoch += 1
                self.epoch_step = 0
                self._callbacks.call("on_epoch_begin", self.epoch, {})
            if spe is not None:
                return next(self._iterator)
            batch = self._backend.next_agreed(self._iterator)  # unknown length: agreed
            if batch is not None:
                return batch
            self._iterator = None
            self._callbacks.call("on_epoch_end", self.epoch, self._last_logs())
            if self._stop_requested():
                return None

    def more_batches(self, count: int) -> list:
        """Up to ``count`` more batches of the current epoch, fewer at its end (for
        ``steps_per_execution``; epochs of known length only, else none)."""
        spe = self.steps_per_epoch
        if not (spe and spe > 0) or self._iterator is None:
            return []
        # epoch_step counts the steps taken; one batch was handed out beyond them
        return [next(self._iterator) for _ in range(max(0, min(count, spe - self.epoch_step - 1)))]

    def close(self) -> None:
        """Ends the epoch in progress (its ``on_epoch_end``). The iterator is kept, not
        dropped: destroying a tf.data iterator in the middle of its stream waits for its
        background threads, which took 1.2 s on a rank with one core."""
        if self._iterator is not None:
            self._callbacks.call("on_epoch_end", self.epoch, self._last_logs())
        self._spent_iterator, self._iterator = self._iterator, None
