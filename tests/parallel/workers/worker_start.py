"""What every scenario worker does first: start the backend and name this worker."""
import hvdtrain


def start(strategy: str) -> int:
    """Starts Horovod (``"horovod"``) or the tf.distribute ``strategy``, before any other
    TensorFlow op; returns this worker's rank (its task index under tf.distribute)."""
    if strategy == "horovod":
        hvdtrain.init()
        return hvdtrain.rank()
    return hvdtrain.get_strategy(strategy).cluster_resolver.task_id or 0
