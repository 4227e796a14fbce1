"""The benchmarks behind ``hvdtrain bench`` and ``hvdtrain bench-backends``, and the cost
model of ``hvdtrain bench --report``: a tool shipped beside the ``hvdtrain`` library in
the same distribution, imported only by :mod:`hvdtrain.cli` and the workers.

* :mod:`~hvdtrain_bench.commands`: the two subcommands' options and output;
* :mod:`~hvdtrain_bench.driver`, :mod:`~hvdtrain_bench.report`: ``hvdtrain bench``'s
  runs, summary and table; :mod:`~hvdtrain_bench.launch`: its job command lines;
* :mod:`~hvdtrain_bench.worker`: one rank of a timed job (``python -m hvdtrain_bench
  --worker``), timing :mod:`~hvdtrain_bench.loops` (the Trainer, Keras fit) or
  :mod:`~hvdtrain_bench.baselines` (hand-written Horovod / MultiWorkerMirrored loops), or
  :mod:`~hvdtrain_bench.probe` (all-reduce timings); :mod:`~hvdtrain_bench.mlp`: the models;
  :mod:`~hvdtrain_bench.timing`: how a loop is timed and its host reads counted;
* :mod:`~hvdtrain_bench.links`, :mod:`~hvdtrain_bench.link_figures`: ``hvdtrain bench
  --hosts N --link RATE``, the loops on network-namespace hosts with shaped links, against
  the wire's limit and the cost model;
* :mod:`~hvdtrain_bench.backends`, :mod:`~hvdtrain_bench.strategy_worker`:
  ``hvdtrain bench-backends``;
* :mod:`~hvdtrain_bench.jobs`: the one job runner of both, and where the helper scripts
  are (``$HVDTRAIN_BENCH_SCRIPTS``, else the package's ``scripts/``);
  :mod:`~hvdtrain_bench.netns`: the namespace hosts of both; :mod:`~hvdtrain_bench.settings`:
  what both share;
* :mod:`~hvdtrain_bench.perf_model`, :mod:`~hvdtrain_bench.perf_report`: the cost model
  and its report.

Nothing is imported here, so importing a submodule loads only what it needs.
"""
