"""``hvdtrain bench --memory``: optimizer-state bytes and peak resident memory per rank,
Adam sharded (``shard_optimizer=True``) against unsharded, at several numbers of ranks.

Each run is one ``horovodrun --gloo`` job training an MLP of about ``--params`` parameters
for a few steps in a ``tf.function`` loop through ``hvdtrain.DistributedOptimizer``; each
rank prints one ``HVDMEM {...}`` line: its optimizer-state bytes (the optimizer's
variables) and its peak resident set (``resource.getrusage``, measured, not computed).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

MARK = "HVDMEM "
DEFAULT_PARAMS = 100_000_000
INPUTS, OUTPUTS = 784, 10


def mlp_width(params: int, hidden_layers: int = 3) -> int:
    """The width ``w`` of ``hidden_layers`` hidden layers with about ``params`` parameters
    (784 inputs, 10 outputs: ``784 w + (hidden_layers - 1) w^2 + 10 w``)."""
    a, b = hidden_layers - 1, INPUTS + OUTPUTS + hidden_layers
    return max(1, int((-b + (b * b + 4 * a * params) ** 0.5) / (2 * a)))


def worker(params: int, shard: bool, steps: int, batch_size: int) -> None:
    """One rank's run: prints its ``HVDMEM`` line."""
    import resource

    import keras
    import tensorflow as tf

    import hvdtrain
    from hvdtrain.horovod import sharded_state

    hvdtrain.init()
    width = mlp_width(params)
    model = keras.Sequential([keras.Input((INPUTS,))]
                             + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
                             + [keras.layers.Dense(OUTPUTS)])
    opt = hvdtrain.DistributedOptimizer(keras.optimizers.Adam(1e-4), shard_optimizer=shard)
    x = tf.random.stateless_normal((batch_size, INPUTS), (1, hvdtrain.rank()))
    y = tf.random.stateless_uniform((batch_size,), (2, 3), maxval=OUTPUTS, dtype=tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    opt.build(model.trainable_variables)  # before the first step, as the Trainer and fit do
    for _ in range(steps):
        loss = float(step())
    try:  # TensorFlow's own allocator (oneDNN's pool on the CPU): its in-use peak
        allocator_peak = int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    except ValueError:  # no statistics kept (e.g. TF_ENABLE_ONEDNN_OPTS=0)
        allocator_peak = None
    record = {"rank": hvdtrain.rank(), "size": hvdtrain.size(), "sharded": shard,
              "params": int(model.count_params()), "state_bytes": sharded_state.state_bytes(opt),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "allocator_peak_bytes": allocator_peak, "loss": loss}
    print(MARK + json.dumps(record), flush=True)


def run(np_list, *, params: int = DEFAULT_PARAMS, steps: int = 3, batch_size: int = 32,
        timeout: float = 1200, progress=None) -> list[dict]:
    """Every rank's record for each number of ranks in ``np_list``, unsharded then sharded.

    Raises:
        RuntimeError: a job failed or printed no record.
    """
    horovodrun = (shutil.which("horovodrun", path=str(Path(sys.executable).parent))
                  or shutil.which("horovodrun"))
    if not horovodrun:
        raise RuntimeError("horovodrun not found next to the Python interpreter or on PATH")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    records = []
    for np in np_list:
        for shard in (False, True):
            cmd = [horovodrun, "-np", str(np), "-H", f"localhost:{np}", "--gloo",
                   sys.executable, "-m", "hvdtrain_bench.memory", str(params), str(int(shard)),
                   str(steps), str(batch_size)]
            if progress:
                progress(f"memory: np={np} {'sharded' if shard else 'unsharded'} ...")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            got = [json.loads(line.split(MARK, 1)[1]) for line in proc.stdout.splitlines()
                   if MARK in line]
            if proc.returncode != 0 or len(got) != np:
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                                   f"{proc.stderr[-2000:]}")
            records += sorted(got, key=lambda r: r["rank"])
    return records


def format_table(records: list[dict]) -> str:
    """One line per rank and run: state bytes and peak RSS, sharded beside unsharded."""
    plain = {(r["size"], r["rank"]): r for r in records if not r["sharded"]}
    lines = [f"{'np':>3} {'rank':>4} {'state MB':>9} {'sharded':>9} {'ratio':>6} "
             f"{'peak RSS MB':>12} {'sharded':>9} {'ratio':>6} {'TF peak MB':>11} "
             f"{'sharded':>9} {'ratio':>6}"]
    for r in records:
        if not r["sharded"]:
            continue
        p = plain[(r["size"], r["rank"])]
        line = (f"{r['size']:>3} {r['rank']:>4} {p['state_bytes'] / 2**20:>9.1f} "
                f"{r['state_bytes'] / 2**20:>9.1f} {r['state_bytes'] / p['state_bytes']:>6.2f} "
                f"{p['peak_rss_bytes'] / 2**20:>12.0f} {r['peak_rss_bytes'] / 2**20:>9.0f} "
                f"{r['peak_rss_bytes'] / p['peak_rss_bytes']:>6.2f}")
        a, b = p.get("allocator_peak_bytes"), r.get("allocator_peak_bytes")
        if a and b:
            line += f" {a / 2**20:>11.0f} {b / 2**20:>9.0f} {b / a:>6.2f}"
        lines.append(line)
    params = records[0]["params"] if records else 0
    lines.append(f"(MLP of {params:,} parameters, Adam; peak RSS from resource.getrusage; TF "
                 "peak: the in-use peak of TensorFlow's CPU allocator, which keeps what it "
                 "freed, so RSS also holds its free space)")
    return "\n".join(lines)


if __name__ == "__main__":
    worker(int(sys.argv[1]), bool(int(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]))
