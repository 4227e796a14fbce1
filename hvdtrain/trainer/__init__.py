"""The Trainer and its parts: the loop and its lifecycle (``trainer.py``), the start-up
agreement (``agreement.py``), epochs and the resume position (``epochs.py``), each epoch's
logs and the History (``history.py``), and metrics, ``evaluate``, ``predict``, ``save``
and ``export`` (``evaluation.py``).

Nothing outside this package imports it but the package's front door (``hvdtrain.Trainer``).
"""
from hvdtrain.trainer.trainer import STRATEGIES, ParameterServerTrainer, Trainer  # noqa: F401
