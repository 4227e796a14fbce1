"""Stand-in for Databricks' ``sparkdl.HorovodRunner`` in corpus runs (scripts/run_corpus.py).

On Databricks, ``HorovodRunner(np=N).run(fn, **kwargs)`` pickles ``fn`` and starts it on N
Spark tasks under ``mpirun``. A corpus run is already one of ``horovodrun``'s ranks, so the
stand-in calls ``fn(**kwargs)`` in place and returns what it returns (as HorovodRunner returns
rank 0's value).
"""


class HorovodRunner:
    def __init__(self, *, np, driver_log_verbosity="log_callback_only"):
        self.num_processor = np

    def run(self, main, **kwargs):
        return main(**kwargs)
