"""Validation during and after training: one collective mean over the whole validation
set, and the loop that trains and validates every few steps (mixed into the Trainer)."""
from __future__ import annotations

from hvdtrain import options
from hvdtrain import program as programs


class Validation:
    """Mixed into :class:`hvdtrain.Trainer`: validation over every worker's shard."""

    def train_and_validate_to_end(self, validate_step_size: int = 50) -> list:
        """Trains to the end, logging validation metrics every ``validate_step_size`` steps.

        Returns:
            The final ``validation_metrics`` (empty without a validation dataset).
        """
        options.positive_int(validate_step_size, "validate_step_size")
        metrics, at_step = [], None
        while not self.should_stop():
            self.train_on_batch()
            if self._validation_dataset is not None and self.global_step % validate_step_size == 0:
                metrics, at_step = self.validation_metrics, self.global_step
                self._report_validation(metrics)
        if self._validation_dataset is not None and at_step != self.global_step:
            metrics = self.validation_metrics
            self._report_validation(metrics)
        return metrics

    @property
    def validation_metrics(self) -> list:
        """``[(name, mean)]`` over the whole validation set, from every worker.

        A collective: every worker evaluates its shard and the sums are reduced, so the
        result is the mean over every example. Read it on every worker.
        """
        if self._validation_dataset is None:
            raise ValueError("validation_metrics needs a validation_dataset")
        if self._validation is None:
            spec = self._validation_dataset.element_spec
            self._validation = (programs.build_validation_program(
                self._build_validation_func, spec, self._network)
                if self._build_validation_func is not None else self._program)
        program = self._validation
        sums, count = self._backend.evaluate(program, self._validation_dataset, self.batch_size)
        return [(k, sums.get(k, 0.0) / count if count else 0.0) for k in sorted(program.output_keys)]

    def _report_validation(self, metrics: list) -> None:
        self._reporter.log_validation(self.global_step, metrics)
        self.callbacks.call("on_test_end", {f"val_{k}": v for k, v in metrics})
