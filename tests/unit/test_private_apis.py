"""Every private API of Keras, TensorFlow and Horovod that hvdtrain relies on still exists
and behaves as relied upon (one process, fast). A failure names the API, the installed
version of the dependency and the module to adapt."""
import contextlib
import inspect

import horovod
import keras
import numpy as np
import pytest
import tensorflow as tf
from horovod.common import elastic as horovod_elastic

import hvdtrain.keras as hvk
from hvdtrain.horovod import horovod_private
from hvdtrain.horovod import optimizer as optim
from hvdtrain.horovod import sharded
from hvdtrain.internals import keras_private, tensorflow_private

_WHERE = {
    "Keras": (keras.__version__, "hvdtrain/internals/keras_private.py"),
    "TensorFlow": (tf.__version__, "hvdtrain/internals/tensorflow_private.py"),
    "Horovod": (horovod.__version__, "hvdtrain/horovod/horovod_private.py"),
}


@contextlib.contextmanager
def relied_on(dependency: str, api: str):
    """Turns any failure inside into one message naming the private API and the version."""
    version, module = _WHERE[dependency]
    try:
        yield
    except Exception as err:  # noqa: BLE001 - every failure means the API changed
        what = str(err).split("\n")[0] or type(err).__name__  # the message, not pytest's detail
        pytest.fail(f"{dependency} {version} changed the private API {api}, which hvdtrain "
                    f"relies on: {what}. Adapt {module} (and its callers) to this version.",
                    pytrace=False)


def _params(fn) -> list:
    return list(inspect.signature(fn).parameters)


class _Const(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, value):
        self.value = value

    def __call__(self, step):
        return keras.ops.cast(self.value, "float32")


# ---------------------------------------------------------------------- Keras optimizers


def test_learning_rate_slot_holds_the_variable_or_the_schedule():
    with relied_on("Keras", "Optimizer._learning_rate"):
        slot = keras_private.learning_rate_slot(keras.optimizers.SGD(0.25))
        assert hasattr(slot, "assign"), f"for a number it holds {type(slot).__name__}, not a variable"
        assert float(slot.numpy()) == 0.25, f"the variable holds {slot.numpy()}, not 0.25"
        schedule = _Const(0.5)
        slot = keras_private.learning_rate_slot(keras.optimizers.SGD(schedule))
        assert slot is schedule, f"for a schedule it holds {slot!r}, not the schedule itself"
        fn = lambda: 0.3  # noqa: E731
        slot = keras_private.learning_rate_slot(keras.optimizers.SGD(fn))
        assert slot is fn, f"for a callable it holds {slot!r}, not the callable itself"


def test_set_learning_rate_slot_makes_the_optimizer_use_a_schedule():
    with relied_on("Keras", "Optimizer._learning_rate (assigned)"):
        opt = keras.optimizers.SGD(0.1)
        v = keras.Variable([1.0])
        opt.build([v])
        keras_private.set_learning_rate_slot(opt, _Const(0.25))
        assert float(opt.learning_rate) == 0.25, "learning_rate does not evaluate the new schedule"
        opt.apply([tf.constant([1.0])], [v])
        assert np.allclose(v.numpy(), [0.75]), f"the step used another rate: weight {v.numpy()}"


def test_passes_counter_counts_every_apply_and_iterations_divides_it():
    with relied_on("Keras", "Optimizer._iterations"):
        opt = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
        v = keras.Variable([1.0])
        for _ in range(3):
            opt.apply([tf.constant([1.0])], [v])
        assert int(keras_private.passes_counter(opt).numpy()) == 3, "it does not count passes"
        assert int(opt.iterations.numpy()) == 1, "iterations is not passes // steps"


def test_make_iterations_atomic_sends_the_increment_to_the_tf_variable():
    with relied_on("Keras", "Optimizer.iterations.assign_add (instance override)"):
        opt = keras.optimizers.SGD(0.1)
        v = keras.Variable([1.0])
        opt.build([v])
        keras_private.make_iterations_atomic(opt)
        counter = opt.iterations
        assert isinstance(counter.value, tf.Variable), (
            f"iterations.value is {type(counter.value).__name__}, not a tf.Variable")
        atomic, calls = counter.assign_add, []

        def spy(value):
            calls.append(value)
            return atomic(value)

        def racy(*args, **kwargs):
            raise AssertionError("apply increments iterations with assign(), a racy read-write")

        counter.assign_add, counter.assign = spy, racy
        opt.apply([tf.constant([1.0])], [v])
        tf.function(lambda: opt.apply([tf.constant([1.0])], [v]))()
        assert len(calls) == 2, (f"apply called iterations.assign_add {len(calls)} times in two "
                                 "steps: it no longer increments through the counter overridden")
        assert int(counter.value.numpy()) == 2, f"the tf.Variable counts {counter.value.numpy()}"


class _Recorder(keras.optimizers.SGD):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        keras_private.set_untracked(self, "calls", [])

    def _backend_apply_gradients(self, grads, trainable_variables):
        self.calls.append(("apply", list(grads), list(trainable_variables)))
        result = super()._backend_apply_gradients(grads, trainable_variables)
        self.calls.append(("applied",))
        return result

    def _clip_gradients(self, grads):
        self.calls.append(("clip", list(grads)))
        return [tf.zeros_like(g) for g in super()._clip_gradients(grads)]  # applied: zeros


def test_optimizer_hooks_exist_with_their_signatures():
    with relied_on("Keras", f"Optimizer hooks {keras_private.OPTIMIZER_HOOKS}"):
        for cls in (keras.optimizers.Optimizer, keras.optimizers.SGD, keras.optimizers.Adam,
                    keras.optimizers.LossScaleOptimizer):
            missing = keras_private.missing_optimizer_hooks(cls)
            assert not missing, f"{cls.__name__} lacks {missing}"
        base = keras.optimizers.Optimizer
        assert _params(base._backend_apply_gradients) == ["self", "grads", "trainable_variables"], (
            f"_backend_apply_gradients takes {_params(base._backend_apply_gradients)}")
        assert _params(base._clip_gradients) == ["self", "grads"], (
            f"_clip_gradients takes {_params(base._clip_gradients)}")


def test_apply_calls_the_hooks_in_order_and_uses_what_clip_returns():
    with relied_on("Keras", f"Optimizer hooks {keras_private.OPTIMIZER_HOOKS} called by apply"):
        opt = _Recorder(0.5)
        v = keras.Variable([1.0, 2.0])
        g = tf.constant([3.0, 4.0])
        opt.apply([g], [v])
        kinds = [c[0] for c in opt.calls]
        assert kinds == ["apply", "clip", "applied"], (
            f"apply called {kinds}: _clip_gradients must run once inside _backend_apply_gradients")
        assert opt.calls[0][2] == [v], "_backend_apply_gradients did not get the variables"
        assert np.allclose(opt.calls[1][1][0].numpy(), g.numpy()), "_clip_gradients got other values"
        assert np.allclose(v.numpy(), [1.0, 2.0]), "the update did not use _clip_gradients's result"


def test_clip_hook_runs_after_local_gradient_accumulation():
    with relied_on("Keras", "Optimizer._clip_gradients with gradient_accumulation_steps"):
        opt = _Recorder(0.5, gradient_accumulation_steps=2)
        v = keras.Variable([1.0])
        opt.apply([tf.constant([1.0])], [v])
        assert [c[0] for c in opt.calls].count("clip") == 0, "clipped before the update step"
        opt.apply([tf.constant([3.0])], [v])
        clips = [c for c in opt.calls if c[0] == "clip"]
        assert len(clips) == 1, f"{len(clips)} clip calls on the update step"
        assert np.allclose(clips[0][1][0].numpy(), [2.0]), (
            f"_clip_gradients got {clips[0][1][0].numpy()}, not the accumulated mean [2.0]")


def test_distributed_mixin_overrides_exactly_the_listed_hooks():
    overridden = {n for n in vars(optim._DistributedMixin)
                  if n.startswith("_") and not n.startswith(("__", "_hvd_"))}
    assert overridden == set(keras_private.OPTIMIZER_HOOKS), (
        f"_DistributedMixin overrides {sorted(overridden)}: keep keras_private.OPTIMIZER_HOOKS "
        "in step with it")


def test_sharded_hooks_decay_the_applied_variables_and_tell_excluded_ones():
    with relied_on("Keras", f"Optimizer hooks {keras_private.SHARDED_HOOKS}"):
        decayed = []

        class Decaying(keras.optimizers.SGD):
            def _apply_weight_decay(self, variables):
                decayed.append(list(variables))

        opt = Decaying(0.1, weight_decay=0.5)
        kernel, bias = keras.Variable([1.0], name="kernel"), keras.Variable([1.0], name="bias")
        opt.exclude_from_weight_decay(var_names=["bias"])
        opt.apply([tf.constant([1.0])] * 2, [kernel, bias])
        assert len(decayed) == 1 and decayed[0] == [kernel, bias], (
            "apply did not call _apply_weight_decay once with the variables it updates")
        assert keras_private.uses_weight_decay(opt, kernel), "_use_weight_decay(kernel)"
        assert not keras_private.uses_weight_decay(opt, bias), (
            "_use_weight_decay did not exclude the variable named in exclude_from_weight_decay")


def test_gradient_accumulators_hold_the_pending_passes():
    with relied_on("Keras", "Optimizer._accumulated_gradients"):
        opt = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
        v = keras.Variable([1.0, 2.0])
        opt.apply([tf.constant([3.0, 4.0])], [v])
        accumulators = keras_private.gradient_accumulators(opt)
        assert len(accumulators) == 1 and np.allclose(accumulators[0].numpy(), [3.0, 4.0]), (
            "the accumulator does not hold the first pass's gradient")
        assert any(a is accumulators[0] for a in opt.variables), "not an optimizer variable"


def test_the_sharded_mixin_overrides_only_listed_hooks():
    overridden = {n for n in vars(sharded.ShardedMixin) if n.startswith("_")
                  and not n.startswith("__") and n in dir(keras.optimizers.Optimizer)}
    listed = set(keras_private.OPTIMIZER_HOOKS + keras_private.SHARDED_HOOKS)
    assert overridden and overridden <= listed, (
        f"ShardedMixin overrides {sorted(overridden - listed)} of Keras's private methods: "
        "list them in keras_private")


class _CountingMixin:
    def apply(self, grads, trainable_variables=None):
        keras_private.set_untracked(self, "applied", getattr(self, "applied", 0) + 1)
        return super().apply(grads, trainable_variables)


@pytest.mark.parametrize("make", [lambda: keras.optimizers.SGD(0.5),
                                  lambda: keras.optimizers.LossScaleOptimizer(
                                      keras.optimizers.SGD(0.5))])
def test_optimizer_class_can_be_extended_in_place(make):
    with relied_on("Keras", "optimizer.__class__ assignment (class layout)"):
        opt, twin = make(), make()
        base, config = type(opt), opt.get_config()
        v, w = keras.Variable([1.0]), keras.Variable([1.0])
        opt.build([v])
        twin.apply([tf.constant([1.0])], [w])
        before = list(opt.variables)
        keras_private.extend_class_in_place(opt, _CountingMixin)
        assert isinstance(opt, base) and isinstance(opt, _CountingMixin), "the class swap failed"
        assert type(opt).__name__ == base.__name__, f"the class is named {type(opt).__name__}"
        assert [id(x) for x in opt.variables] == [id(x) for x in before], "variables changed"
        opt.apply([tf.constant([1.0])], [v])
        assert getattr(opt, "applied", 0) == 1, "apply does not reach the mixin first"
        assert np.allclose(v.numpy(), w.numpy()), f"the step gave {v.numpy()}, not {w.numpy()}"
        again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
        assert type(again) is base, f"serialized and read back as {type(again).__name__}"
        assert again.get_config() == config, "serialized with another config"


def test_set_untracked_keeps_variables_out_of_the_optimizer():
    with relied_on("Keras", "Optimizer.__setattr__ tracking (bypassed with object.__setattr__)"):
        opt = keras.optimizers.SGD(0.1)
        opt.build([keras.Variable([1.0])])
        count = len(opt.variables)
        keras_private.set_untracked(opt, "_hvd_distributed", [keras.Variable([2.0])])
        assert len(opt.variables) == count, "variables set past tracking were added"
        assert len(opt._hvd_distributed) == 1, "the attribute was not set"


# ---------------------------------------------------------------------- Keras layers, callbacks


class _Wrapper(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.inner = keras.layers.Dense(2, name="attr_dense")

    def call(self, x):
        return self.inner(x)


def test_flatten_layers_lists_every_nested_layer():
    with relied_on("Keras", "Layer._flatten_layers(include_self=True)"):
        inner = keras.Sequential([keras.layers.Dense(3, name="inner_dense")], name="inner")
        wrapper = _Wrapper()
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="outer_dense"),
                                  inner, wrapper], name="outer")
        names = [layer.name for layer in keras_private.flatten_layers(model)]
        for name in ("outer", "outer_dense", "inner", "inner_dense", wrapper.name, "attr_dense"):
            assert name in names, f"{name!r} missing from {names}"
        assert names[0] == "outer", f"the model itself is not first: {names}"


def test_seed_generator_states_are_the_dropout_streams():
    with relied_on("Keras", "seed generators' variables named .../seed_generator_state"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5, seed=1)])
        states = keras_private.seed_generator_states(model)
        assert len(states) == 1 and isinstance(states[0], tf.Variable), states
        before = states[0].numpy().copy()
        model(np.ones((2, 4), "float32"), training=True)
        assert not np.array_equal(before, states[0].numpy()), "a draw did not advance the state"


def test_last_call_outputs_are_the_outputs_of_the_latest_symbolic_call():
    with relied_on("Keras", "Layer._inbound_nodes[-1].output_tensors"):
        x = keras.Input((4,))
        network = keras.Sequential([keras.layers.Dense(3)])
        assert keras_private.last_call_outputs(keras.layers.Dense(2)) == []
        network(x)
        out = network(keras.ops.cast(x, "float32") * 2)
        outputs = keras_private.last_call_outputs(network)
        assert len(outputs) == 1 and outputs[0] is out, outputs


def test_metric_direction_says_which_way_is_better():
    with relied_on("Keras", "Metric._direction ('up' / 'down')"):
        assert keras_private.metric_direction(keras.metrics.AUC()) == "up"
        assert keras_private.metric_direction(keras.metrics.MeanSquaredError()) == "down"


def test_reinitialize_variable_replaces_the_backing_tf_variable():
    with relied_on("Keras", "Variable._initialize(value)"):
        layer = keras.layers.Dense(2, kernel_initializer="ones", use_bias=False)
        layer.build((None, 3))
        v = layer.kernel
        old, name, trainable = v.value, v.name, v.trainable
        assert _params(type(v)._initialize) == ["self", "value"], (
            f"_initialize takes {_params(type(v)._initialize)}")
        with tf.device("/CPU:0"):
            keras_private.reinitialize_variable(v, tf.fill((3, 2), 2.0))
        assert isinstance(v.value, tf.Variable) and v.value is not old, "no new tf.Variable"
        assert v.value.device.endswith("CPU:0"), f"the new tf.Variable is on {v.value.device}"
        assert (v.name, v.trainable, v.dtype) == (name, trainable, "float32"), "attributes changed"
        out = layer(np.ones((1, 3), "float32"))
        assert np.allclose(out, 6.0), f"the layer computes {np.asarray(out)} with the new value"


def test_model_checkpoint_saves_through_the_hook():
    api = f"keras.callbacks.ModelCheckpoint.{keras_private.CHECKPOINT_SAVE_HOOK}"
    with relied_on("Keras", api):
        assert keras_private.has_checkpoint_save_hook(), "the method is gone"
        hook = getattr(keras.callbacks.ModelCheckpoint, keras_private.CHECKPOINT_SAVE_HOOK)
        assert _params(hook) == ["self", "epoch", "batch", "logs"], f"it takes {_params(hook)}"
        calls = []

        class Spy(keras.callbacks.ModelCheckpoint):
            pass

        setattr(Spy, keras_private.CHECKPOINT_SAVE_HOOK,
                lambda self, epoch, batch, logs: calls.append((epoch, batch, dict(logs))))
        cb = Spy("unused.keras")
        cb.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
        cb.on_train_begin()
        cb.on_epoch_begin(0)
        cb.on_epoch_end(0, {"loss": 1.0})
        assert calls == [(0, None, {"loss": 1.0})], f"the epoch-end save called it with {calls}"
    assert keras_private.CHECKPOINT_SAVE_HOOK in vars(hvk.ModelCheckpoint), (
        "hvdtrain.keras.ModelCheckpoint no longer overrides keras_private.CHECKPOINT_SAVE_HOOK")


# ---------------------------------------------------------------------- TensorFlow


def test_num_workers_of_a_parameter_server_strategy(monkeypatch):
    cls = tf.distribute.experimental.ParameterServerStrategy
    with relied_on("TensorFlow", "ParameterServerStrategy.extended._num_workers"):
        # Built without servers: connecting is stubbed out (this test's only use of it).
        monkeypatch.setattr(cls, "_connect_to_cluster", lambda self, coordinator_name: None)
        spec = tf.train.ClusterSpec({"chief": ["localhost:1"], "ps": ["localhost:2"],
                                     "worker": ["localhost:3", "localhost:4", "localhost:5"]})
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = cls(resolver)
        got = tensorflow_private.num_workers(strategy)
        assert got == 3, f"num_workers is {got} for a cluster spec with 3 workers"


def test_dataset_graph_round_trip():
    with relied_on("TensorFlow", "raw_ops.DatasetToGraphV2 / DatasetFromGraph"):
        ds = tf.data.Dataset.from_tensor_slices(np.arange(6, dtype="int64")).map(
            lambda x: (x * 2, x)).batch(2)
        graph = tensorflow_private.dataset_to_graph(ds)
        assert graph.dtype == tf.string, f"the graph is a {graph.dtype}, not a serialized string"
        back = tensorflow_private.dataset_from_graph(graph, ds.element_spec)
        got = [(a.tolist(), b.tolist()) for a, b in back.as_numpy_iterator()]
        want = [(a.tolist(), b.tolist()) for a, b in ds.as_numpy_iterator()]
        assert got == want, f"rebuilt dataset gives {got}, not {want}"


# ---------------------------------------------------------------------- Horovod


class _State(horovod_private.ElasticStateBase):
    def __init__(self):
        self.log, self.sent = [], []

        def bcast(obj):
            self.sent.append(obj)
            return obj

        super().__init__(bcast_object=bcast, get_rank=lambda: 0)

    def save(self):
        self.log.append("save")

    def restore(self):
        self.log.append("restore")

    def sync(self):
        self.log.append("sync")

    def reset(self):
        self.log.append("reset")


def test_elastic_state_base_signature_and_commit():
    from horovod.runner.elastic.worker import HostUpdateResult

    with relied_on("Horovod", "horovod.common.elastic.State"):
        base = horovod_private.ElasticStateBase
        assert _params(base.__init__) == ["self", "bcast_object", "get_rank"], (
            f"State.__init__ takes {_params(base.__init__)}")
        for name in ("commit", "save", "restore", "sync", "reset", "on_reset",
                     "register_reset_callbacks", "on_hosts_updated", "check_host_updates"):
            assert callable(getattr(base, name, None)), f"State lacks {name}()"
        state = _State()
        state.commit()
        assert state.log == ["save"], f"commit() called {state.log}, not save()"
        assert len(state.sent) == 1, "commit() did not broadcast the host-update check"
        state.on_hosts_updated(1.0, HostUpdateResult.removed)
        with pytest.raises(horovod_private.HostsUpdatedInterrupt) as info:
            state.commit()
        assert info.value.skip_sync is True, "hosts only removed must skip the sync"
        state.on_hosts_updated(2.0, HostUpdateResult.added)
        with pytest.raises(horovod_private.HostsUpdatedInterrupt) as info:
            state.commit()
        assert info.value.skip_sync is False, "hosts added must not skip the sync"
        called = []
        state.log.clear()
        state.register_reset_callbacks([lambda: called.append(state.log[:])])
        state.on_reset()
        assert called == [["reset"]], f"on_reset() ran reset then callbacks as {called}"


def test_elastic_exceptions():
    with relied_on("Horovod", "horovod.common.exceptions"):
        err = horovod_private.HorovodInternalError("AbortedError: ring broke")
        assert isinstance(err, Exception) and "ring broke" in str(err), "cannot carry a message"
        assert horovod_private.HostsUpdatedInterrupt(True).skip_sync is True, "no skip_sync"
        assert not issubclass(horovod_private.HorovodInternalError,
                              horovod_private.HostsUpdatedInterrupt), "the two errors merged"


def test_elastic_run_fn_restores_resets_and_retries(monkeypatch):
    monkeypatch.delenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", raising=False)  # no driver to notify
    with relied_on("Horovod", "horovod.common.elastic.run_fn(func, reset)"):
        assert _params(horovod_elastic.run_fn) == ["func", "reset"], (
            f"run_fn takes {_params(horovod_elastic.run_fn)}")
        failures = [horovod_private.HorovodInternalError("broken"),
                    horovod_private.HostsUpdatedInterrupt(True)]
        resets = []

        def train(state, extra, *, key):
            state.log.append(f"train {extra} {key}")
            if failures:
                raise failures.pop(0)
            return "done"

        state = _State()
        run = horovod_private.elastic_run_fn(train, lambda: resets.append(list(state.log)))
        assert run(state, 1, key=2) == "done", "did not return func's result"
        want = ["sync", "train 1 2", "restore",  # a failed collective: back to the commit
                "reset", "sync", "train 1 2",    # restarted, synced, retried
                "reset", "train 1 2"]            # hosts removed: restarted without sync
        assert state.log == want, f"the elastic loop ran {state.log}, not {want}"
        assert len(resets) == 2, f"reset() ran {len(resets)} times, not 2"


class _Placement:
    """What Horovod's elastic rendezvous handler asks of its driver: the new world."""

    def __init__(self, slots: dict):
        self.slots, self.ready = slots, []

    def record_ready(self, host, local_rank):
        self.ready.append(f"{host}:{local_rank}")

    def get_slot_info(self, host, local_rank):
        from horovod.runner.common.util import hosts
        return self.slots.get(f"{host}:{local_rank}", hosts.INVALID_SLOT_INFO)


def test_elastic_slot_is_asked_from_horovods_rendezvous_server(monkeypatch):
    from horovod.runner.common.util import hosts
    from horovod.runner.elastic.rendezvous import create_rendezvous_handler
    from horovod.runner.http.http_server import RendezvousServer

    with relied_on("Horovod", "the elastic rendezvous's rank_and_size answer"):
        kept = hosts.SlotInfo(hostname="127.0.0.1", rank=1, local_rank=0, cross_rank=1,
                              size=3, local_size=2, cross_size=2)
        driver = _Placement({"127.0.0.1:0": kept})
        server = RendezvousServer()
        port = server.start(create_rendezvous_handler(driver))
        try:
            monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
            monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(port))
            monkeypatch.setenv("HOROVOD_HOSTNAME", "127.0.0.1")
            monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
            slot = horovod_private.elastic_slot_after_reset(timeout=10)
            assert slot == {"rank": 1, "size": 3, "local_rank": 0, "local_size": 2,
                            "cross_rank": 1, "cross_size": 2}, f"parsed {slot}"
            monkeypatch.setenv("HOROVOD_HOSTNAME", "localhost")
            assert horovod_private.elastic_slot_after_reset(timeout=10) is None, (
                "a removed slot is not answered with rank -1")
            assert driver.ready == ["127.0.0.1:0", "localhost:0"], (
                f"asking did not count as arrival at the rendezvous: {driver.ready}")
        finally:
            server.stop()


def test_horovod_asks_the_rendezvous_itself_only_when_elastic_is_set(monkeypatch):
    import glob
    import os

    with relied_on("Horovod", "GlooContext::Initialize's elastic re-init"):
        libs = glob.glob(os.path.join(os.path.dirname(horovod.__file__), "tensorflow",
                                      "mpi_lib*.so"))
        assert libs, "no horovod/tensorflow/mpi_lib*.so"
        data = open(libs[0], "rb").read()
        for text in (b"elastic mode reinitialization started", b"HOROVOD_ELASTIC",
                     b"has been removed from elastic job", b"HOROVOD_CROSS_SIZE"):
            assert text in data, f"the library no longer holds {text.decode()!r}"
        seen = {}
        # init_at_slot sets HOROVOD_RANK, HOROVOD_SIZE... for good (a worker's new slot):
        # here on a copy, or every job this pytest process starts later would inherit them
        monkeypatch.setattr(os, "environ", dict(os.environ))
        monkeypatch.setenv("HOROVOD_ELASTIC", "1")

        def init():
            seen.update({k: os.environ[k] for k in os.environ if k.startswith("HOROVOD_")})

        slot = dict(zip(horovod_private.SLOT_FIELDS, [2, 4, 0, 2, 1, 2]))
        horovod_private.init_at_slot(slot, init)
        assert seen["HOROVOD_ELASTIC"] == "0" and seen["HOROVOD_RANK"] == "2"
        assert seen["HOROVOD_SIZE"] == "4" and seen["HOROVOD_CROSS_RANK"] == "1"
        assert os.environ["HOROVOD_ELASTIC"] == "1", "HOROVOD_ELASTIC not set back"


def _unbuilt_regression():
    return keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])


@pytest.mark.parametrize("jit", [False, True])
def test_fit_goes_through_the_routed_make_train_function(jit):
    from hvdtrain.horovod import keras_steps

    with relied_on("Keras", "fit calling self.make_train_function(), which reads train_step "
                            "and jit_compile"):
        model = _unbuilt_regression()
        model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                      loss="mse", jit_compile=jit)
        callback = hvk.BroadcastGlobalVariablesCallback(0)
        x = np.random.RandomState(0).rand(16, 3).astype("float32")
        model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[callback])
        assert keras_private.routes_make_train_function(model)
        assert callback.broadcast_done and keras_steps.model_built(model)
        # XLA: the user's step was compiled on its own, the exchange outside it.
        assert keras_steps.xla_compiled(model) == jit
        assert model.jit_compile == jit and "train_step" not in model.__dict__


def test_no_model_but_those_handed_to_hvdtrain_has_its_step_rerouted():
    """A distributed optimizer patches nothing global: a model given to no hvdtrain
    callback trains with Keras's own step, and Keras's class is untouched."""
    model = _unbuilt_regression()
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x = np.random.RandomState(0).rand(16, 3).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    assert not keras_private.routes_make_train_function(model)
    assert keras.Model.make_train_function.__module__.startswith("keras.")

    xla = _unbuilt_regression()  # XLA needs the split: the error names the fix
    xla.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                jit_compile=True)
    with pytest.raises(ValueError, match="pass BroadcastGlobalVariablesCallback"):
        xla.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)


def test_build_from_batch_builds_a_first_batch_model():
    with relied_on("Keras", "Model._symbolic_build(data_batch=...)"):
        model = _unbuilt_regression()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        keras_private.build_from_batch(model, (tf.zeros([2, 3]), tf.zeros([2, 1])))
        assert model.built and [tuple(v.shape) for v in model.trainable_variables] == [
            (3, 4), (4,), (4, 1), (1,)]
        assert model.optimizer.built


def test_batch_norm_computes_its_moments_through_the_hook():
    from hvdtrain.horovod import runtime
    from hvdtrain.horovod.sync_batch_norm import SyncBatchNormalization

    runtime.init()  # the synchronized layer asks Horovod for the world size (alone, too)
    with relied_on("Keras", "BatchNormalization._moments(inputs, mask)"):
        calls = []

        class Spy(keras.layers.BatchNormalization):
            def _moments(self, inputs, mask):
                calls.append(mask)
                return super()._moments(inputs, mask)

        Spy()(np.ones((4, 3), "float32"), training=True)
        assert calls == [None]
        # One process: the synchronized layer is the plain one.
        x = np.random.RandomState(0).rand(8, 3).astype("float32")
        keras.utils.set_random_seed(0)
        plain = keras.layers.BatchNormalization()(x, training=True).numpy()
        keras.utils.set_random_seed(0)
        np.testing.assert_allclose(SyncBatchNormalization()(x, training=True).numpy(), plain)


def test_in_xla_context_sees_a_jit_compiled_function_and_its_callers_callees():
    seen = []

    @tf.function(jit_compile=True)
    def compiled(x):
        seen.append(tensorflow_private.in_xla_context())
        return x * 2

    @tf.function
    def outer(x):
        seen.append(tensorflow_private.in_xla_context())
        return compiled(x)

    with relied_on("TensorFlow", "control_flow_util.GraphOrParentsInXlaContext"):
        outer(tf.constant(1.0))
        assert seen == [False, True] and not tensorflow_private.in_xla_context()


def test_an_exchange_traced_under_xla_is_refused_with_the_fix():
    from hvdtrain.horovod import collectives

    @tf.function(jit_compile=True)
    def step(g):
        return collectives.reduce_gradients([g])[0]

    with pytest.raises(ValueError, match="jit_compile=True.*no XLA kernels"):
        step(tf.ones([2]))


def test_count_host_reads_counts_each_device_to_host_read_of_an_eager_tensor():
    """``hvdtrain bench``'s host reads per step: every read of an eager tensor's value
    counts once while the block runs, computing on the device counts nothing, and the
    patch is gone afterwards."""
    from tensorflow.python.framework import ops

    with relied_on("TensorFlow", "ops._EagerTensorBase._numpy"):
        one = tf.constant(1.0)
        with tensorflow_private.count_host_reads() as reads:
            float(one)
            assert reads.count == 1, f"float() of an eager tensor counted {reads.count} reads, not 1"
            int(tf.constant(2)), bool(tf.constant(True)), one.numpy(), [0, 1][tf.constant(1)]
            tf.Variable(3.0).numpy()
            assert reads.count == 6, (f"int(), bool(), .numpy(), an index and a variable's "
                                      f".numpy() counted {reads.count - 1} reads, not 5")
            tf.reduce_sum(one + one)
            assert reads.count == 6, "computing on the device counted a host read"
        float(one)
        assert reads.count == 6, "a read after the block was counted"
        assert vars(ops._EagerTensorBase)["_numpy"].__name__ == "_numpy", "the patch stayed"


def test_context_started_tells_whether_tensorflow_made_its_context():
    """``init()`` must leave it unmade (tests/unit/test_init_leaves_tensorflow.py runs a
    fresh process); here, where ops ran, it is made."""
    with relied_on("TensorFlow", "context.context()._initialized"):
        tf.constant(1.0) + 1
        assert tensorflow_private.context_started() is True
