"""The Trainer's backends behind one interface (:class:`hvdtrain.backends.base.Backend`):
Horovod (``horovod.py``, over :mod:`hvdtrain.horovod`, the only package that imports
Horovod), tf.distribute's Mirrored and MultiWorkerMirrored strategies (``tfdist/``) and
parameter servers (``ps/``).

Each backend is imported only when a Trainer asks for it, so ``strategy="mirrored"`` and
the parameter-server backend run where Horovod is not installed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the interface loads TensorFlow; cluster specs must not
    from hvdtrain.backends.base import Backend


def create_backend(options) -> "Backend":
    """The backend ``options.backend`` names, set up for ``options`` (a
    :class:`hvdtrain.options.TrainerOptions`)."""
    if options.backend == "horovod":
        try:
            from hvdtrain.backends.horovod import HorovodBackend
        except ImportError as err:
            if "horovod" not in str(err).lower():
                raise
            raise ImportError(f"strategy='horovod' needs Horovod, which cannot be imported "
                              f"({err}): build it with `hvdtrain install-horovod` (or `make install` "
                              "in a checkout), or "
                              "choose strategy='mirrored', 'multi_worker_mirrored' or "
                              "'parameter_server'") from err
        return HorovodBackend(options)
    if options.backend == "parameter_server":
        from hvdtrain.backends.ps.backend import ParameterServerBackend
        return ParameterServerBackend(options)
    from hvdtrain.backends.tfdist.backend import StrategyBackend
    return StrategyBackend(options)
