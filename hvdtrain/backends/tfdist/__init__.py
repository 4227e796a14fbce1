"""The tf.distribute backends: MirroredStrategy and MultiWorkerMirroredStrategy."""
from hvdtrain.backends.tfdist.strategies import NAMES, get_strategy  # noqa: F401
