"""``DistributedSession`` on a cluster without a master (worker 0 coordinates), configured
through TensorPort's JOB_NAME / TASK_INDEX / PS_HOSTS / WORKER_HOSTS variables.

Usage: ps_session.py OUT_DIR (--max-steps N | --seconds S)
Worker 0 writes OUT_DIR/result.json; the other tasks serve until they are ended.
"""
import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import hvdtrain  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None)
    args = p.parse_args()
    out = Path(args.out_dir)
    spec = hvdtrain.TaskSpec()
    hooks = [hvdtrain.StopAtTimeHook(args.seconds)] if args.seconds else []
    t0 = time.monotonic()
    with hvdtrain.DistributedSession(spec, checkpoint_dir=str(out / "ckpt"), hooks=hooks,
                                     max_steps=args.max_steps) as session:
        # Only worker 0 (the master of a cluster without one) gets here.
        with session.scope():
            total = tf.Variable(0.0, name="total")
        restored = session.track(total=total)
        start = float(total.numpy())

        @tf.function
        def step():
            total.assign_add(1.0)
            return tf.distribute.coordinator.experimental_get_current_worker_index()

        results = []
        while not session.should_stop():
            results.append(session.run(step))
        session.join()
        used = sorted({int(r.fetch()) for r in results})
    result = {"is_master": spec.is_master(), "shard_index": spec.shard_index,
              "num_workers": session.num_workers, "restored": restored, "start": start,
              "total": float(total.numpy()), "steps": session.step, "workers_used": used,
              "device": total.device, "seconds": time.monotonic() - t0}
    (out / "result.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
