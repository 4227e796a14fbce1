"""PowerSGD: low-rank gradient compression with error feedback (Vogels et al., NeurIPS 2019).

Each matrix-shaped gradient ``M`` (``n x m``; a conv kernel is seen as ``(h*w*in) x out``)
plus this rank's error ``E`` is sent as two thin matrices instead of itself::

    P = (M + E) Q       all-reduced, then orthogonalised      (n x r)
    Q = (M + E)ᵀ P      all-reduced                            (m x r)
    M̂ = P Qᵀ            the reduced gradient, on every rank
    E = (M + E) - M̂     (in mean units) what was not sent, added to the next step

``Q`` is warm-started from the last step, so one power iteration per step tracks the
gradient's leading subspace. Vectors and matrices too small to gain (``r (n + m)`` not at
least ``min_compression`` times smaller than ``n m``) travel uncompressed in the P
all-reduce of their bucket, and so do the Exchanger's riders. The first ``start_step``
exchanges are plain all-reduces (PowerSGD's ``start_iter``).

Only the sum of the ranks' errors shapes the training (P, Q and M̂ depend on the ranks'
``M + E`` through their sum, and so does the next error's sum). So before a checkpoint
is written every rank's error is set to the ranks' mean (one all-reduce), and the
checkpoint holds that mean, Q and the exchange count: a run resumed from it, on the same
number of ranks, continues as the uninterrupted run does (up to summation order).
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from hvdtrain.horovod import collectives as dist
from hvdtrain.horovod.compression import PowerSGD
from hvdtrain.horovod.exchange_settings import ExchangeSettings, variable_key
from hvdtrain.horovod.exchange_strategies import Strategy

_Q_SEED = 0x50534744  # the initial Q's seed: the same draw on every rank


def orthogonalize(p: tf.Tensor, eps: float = 1e-8) -> tf.Tensor:
    """The columns of ``p`` made orthonormal, in order (modified Gram-Schmidt; a column
    that is (nearly) zero stays (nearly) zero, ``eps`` keeps the division finite)."""
    cols = [p[:, k] for k in range(int(p.shape[1]))]
    for k in range(len(cols)):
        cols[k] = cols[k] / (tf.norm(cols[k]) + eps)
        for j in range(k + 1, len(cols)):
            cols[j] = cols[j] - tf.reduce_sum(cols[k] * cols[j]) * cols[k]
    return tf.stack(cols, axis=1)


class _Matrix:
    """One compressed variable's state: its 2-D shape, Q and this rank's error."""

    def __init__(self, n: int, m: int, r: int, position: int) -> None:
        self.n, self.m, self.r = n, m, r
        self.q = tf.Variable(tf.random.stateless_normal([m, r], seed=[position, _Q_SEED]),
                             trainable=False, name="powersgd_q")
        self.error = tf.Variable(tf.zeros([n, m]), trainable=False, name="powersgd_error")


class LowRankState(tf.Module):
    """PowerSGD's state kept between steps: the exchanges so far, each Q and the error."""

    def __init__(self, steps: tf.Variable, matrices: Sequence[_Matrix]) -> None:
        super().__init__(name="powersgd")
        self.steps = steps
        self.qs = [mat.q for mat in matrices]
        self.errors = [mat.error for mat in matrices]


class LowRank(Strategy):
    """The Exchanger's strategy for :class:`~hvdtrain.horovod.compression.PowerSGD` (see
    the module's docstring)."""

    name = "powersgd"
    carries_riders = True  # they ride uncompressed in the first bucket's P all-reduce
    keeps_gradients = True

    def __init__(self, settings: ExchangeSettings) -> None:
        super().__init__(settings)
        self.compressor: PowerSGD = settings.compression
        self.state: LowRankState | None = None
        self._of: dict[int, _Matrix] = {}

    def build(self, variables: Sequence) -> None:
        """Makes Q and the error of each compressed variable (once)."""
        if self.state is not None:
            return
        matrices = []
        for position, v in enumerate(variables):
            found = self.compressor.matrix_shape(v.shape)
            if found is not None:
                self._of[variable_key(v)] = mat = _Matrix(*found, position)
                matrices.append(mat)
        self.state = LowRankState(tf.Variable(0, dtype=tf.int64, trainable=False,
                                              name="powersgd_steps"), matrices)

    # --- checkpoints: the mean error, Q and the exchange count (see the module docstring)
    saves_state = True
    optional_state = frozenset({"powersgd"})  # a checkpoint of an uncompressed run

    def save_objects(self) -> dict:
        if self.state is None:
            return {}
        if self.state.errors:
            means = dist.reduce_gradients(list(self.state.errors), op=dist.Average)
            for error, mean in zip(self.state.errors, means):
                error.assign(mean)
        return {"powersgd": self.state}

    def restore_objects(self) -> dict:
        return {} if self.state is None else {"powersgd": self.state}

    def start_variables(self) -> list:
        return [] if self.state is None else list(self.state.variables)

    def reduce(self, grads, variables, buckets, seed):
        if self.state is None:  # a tape, or an optimizer built before it was wrapped
            self.build([v for v in variables if v is not None])
        places = [i for i, g in enumerate(grads) if g is not None]
        dense = [tf.convert_to_tensor(grads[i]) for i in places]
        where = {i: k for k, i in enumerate(places)}
        plan = [[where[i] for i in b if i in where] for b in (buckets or [range(len(grads))])]
        mats = [self._of.get(variable_key(variables[i])) if variables and variables[i] is not None
                else None for i in places]
        start = self.compressor.start_step
        if start:
            plain = lambda: dist.reduce_gradients(  # noqa: E731
                dense, op=self.settings.op, prescale=self.settings.prescale,
                postscale=self.settings.postscale, groups=plan)
            reduced = tf.cond(self.state.steps >= start,
                              lambda: self._compressed(dense, mats, plan), plain)
        else:
            reduced = self._compressed(dense, mats, plan)
        self.state.steps.assign_add(1)
        out = list(grads)
        for i, r in zip(places, reduced):
            out[i] = r
        return out

    def _compressed(self, grads: list, mats: list, plan: list[list[int]]) -> list:
        """The two all-reduces of each bucket, Q and the errors updated (kept as they were
        if the step is not finite, e.g. a loss scaler's overflow)."""
        s = self.settings
        scale = dict(op=s.op, prescale=s.prescale, postscale=s.postscale)
        # the reduced value is `to_mean` times the ranks' mean (Sum: size times)
        to_mean = s.prescale * s.postscale * (
            1.0 if s.op is dist.Average else tf.cast(dist.size_now(), tf.float32))
        out = [None] * len(grads)
        updates = []
        for bucket in plan:
            firsts, sent = [], {}
            for k in bucket:
                mat = mats[k]
                if mat is None:
                    sent[k] = len(firsts)
                    firsts.append(grads[k])
                    continue
                m = tf.reshape(tf.cast(grads[k], tf.float32), [mat.n, mat.m]) + mat.error
                sent[k] = (len(firsts), m)
                firsts.append(tf.matmul(m, mat.q))
            first = dist.reduce_gradients(firsts, groups=[list(range(len(firsts)))], **scale)
            compressed = [k for k in bucket if mats[k] is not None]
            ps = {k: orthogonalize(first[sent[k][0]]) for k in compressed}
            qs = dist.reduce_gradients([tf.matmul(sent[k][1], ps[k], transpose_a=True)
                                        for k in compressed],
                                       groups=[list(range(len(compressed)))], **scale)
            for k in bucket:
                if mats[k] is None:
                    out[k] = first[sent[k]]
            for k, q in zip(compressed, qs):
                approx = tf.matmul(ps[k], q, transpose_b=True)
                out[k] = tf.cast(tf.reshape(approx, tf.shape(grads[k])), grads[k].dtype)
                updates.append((mats[k], q, sent[k][1] - approx / to_mean))
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(q)) for _, q, _ in updates]) \
            if updates else tf.constant(True)
        for mat, q, error in updates:
            mat.q.assign(tf.where(finite, q, mat.q))
            mat.error.assign(tf.where(finite, error, mat.error))
        return out
