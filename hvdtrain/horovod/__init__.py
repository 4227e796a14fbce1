"""Horovod for every front door, and the only package of hvdtrain that imports Horovod.

- the runtime: start-up and pinning (``runtime.py``), collectives (``collectives.py``),
  the watchdog for collectives that wait too long (``watchdog.py``), Horovod's private
  APIs (``horovod_private.py``);
- the exchange, the one gradient path of every front door: the ``Exchanger``
  (``exchange.py``: the bucket plan of ``buckets.py``, the riders, the scaling), its
  strategies (``exchange_strategies.py``: all-reduce, sparsified with
  ``compression.py``'s sparsifiers) and settings (``exchange_settings.py``), sparse
  gradients by all-reduce (``sparse_exchange.py``);
- what the steps of the Trainer's Horovod backend and Keras ``fit`` share around it
  (``step.py``): the XLA split, the start broadcast; the step's flags read rarely
  (``step_status.py``);
- the optimizer and the tapes (``optimizer.py``, ``tape.py``);
- Keras glue: ``fit``'s step (``keras_steps.py``), elastic states (``keras_state.py``),
  value collectives (``keras_values.py``), ``SyncBatchNormalization``;
- elastic training (``elastic.py``, ``elastic_runtime.py``), model parallelism inside a
  rank (``hybrid.py``, ``hybrid_plan.py``), Ray (``ray_executor.py``) and the drop-in's
  names (``horovod_api.py``).

The Trainer reaches it through its backend, ``hvdtrain/backends/horovod.py``.
"""
