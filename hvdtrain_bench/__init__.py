"""The benchmarks behind ``hvdtrain bench`` and ``hvdtrain bench-backends``, and the cost
model of ``hvdtrain bench --report``; imported only by the command and the workers.

* :mod:`~hvdtrain.bench.commands`: the two subcommands' options and output;
* :mod:`~hvdtrain.bench.driver`, :mod:`~hvdtrain.bench.report`: ``hvdtrain bench``'s
  runs, summary and table; :mod:`~hvdtrain.bench.launch`: its job command lines;
* :mod:`~hvdtrain.bench.worker`: one rank of a timed job (``python -m hvdtrain.bench
  --worker``), timing :mod:`~hvdtrain.bench.loops` (the Trainer, Keras fit) or
  :mod:`~hvdtrain.bench.baselines` (hand-written Horovod / MultiWorkerMirrored loops), or
  :mod:`~hvdtrain.bench.probe` (all-reduce timings); :mod:`~hvdtrain.bench.mlp`: the models;
  :mod:`~hvdtrain.bench.timing`: how a loop is timed and its host reads counted;
* :mod:`~hvdtrain.bench.links`, :mod:`~hvdtrain.bench.link_figures`: ``hvdtrain bench
  --hosts N --link RATE``, the loops on network-namespace hosts with shaped links, against
  the wire's limit and the cost model;
* :mod:`~hvdtrain.bench.backends`, :mod:`~hvdtrain.bench.strategy_worker`:
  ``hvdtrain bench-backends``;
* :mod:`~hvdtrain.bench.jobs`: the one job runner of both; :mod:`~hvdtrain.bench.settings`:
  what both share;
* :mod:`~hvdtrain.bench.perf_model`, :mod:`~hvdtrain.bench.perf_report`: the cost model
  and its report.

Nothing is imported here, so importing a submodule loads only what it needs.
"""
