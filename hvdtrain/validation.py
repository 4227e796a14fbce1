"""Validation during training: metrics over the whole validation set, and the loop that
trains and validates every few steps (mixed into the Trainer)."""
from __future__ import annotations

import keras

from hvdtrain import options


class Validation:
    """Mixed into :class:`hvdtrain.Trainer`: validation over every worker's shard."""

    def train_and_validate_to_end(self, validate_step_size: int = 50) -> keras.callbacks.History:
        """Trains to the end, logging validation metrics every ``validate_step_size`` steps
        and once more at the end.

        Returns:
            :attr:`history`; its ``val_*`` entries hold the latest validation at each
            epoch's end, and the final validation in the last epoch's entry.
        """
        options.positive_int(validate_step_size, "validate_step_size")
        at_step = None
        while not self.should_stop():
            self.train_on_batch()
            if self._validation_dataset is not None and self.global_step % validate_step_size == 0:
                self._report_validation(self.validation_metrics)
                at_step = self.global_step
        if self._validation_dataset is not None:
            metrics = self.validation_metrics if at_step != self.global_step else None
            if metrics is not None:
                self._report_validation(metrics)
            self._record.final_validation(self._record.validation)
        return self.history

    @property
    def validation_metrics(self) -> list:
        """``[(name, value)]`` over the whole validation set, from every worker: the
        program's outputs as means over every example, then the Trainer's ``metrics``
        (see :meth:`evaluate`). A collective: read it on every worker."""
        if self._validation_dataset is None:
            raise ValueError("validation_metrics needs a validation_dataset")
        return self._metrics_over(self._validation_dataset, self.batch_size)

    def _report_validation(self, metrics: list) -> None:
        self._reporter.log_validation(self.global_step, metrics)
        logs = {f"val_{k}": v for k, v in metrics}
        self._record.validation = logs
        self.callbacks.call("on_test_end", logs)
