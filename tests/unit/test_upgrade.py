"""``hvdtrain upgrade``: each idiom on a small script written for it, the exact text it
becomes and the report's lines; where Keras 3 is the reason, the snippet is run on real
Keras 3 before (it raises) and after (it runs)."""
import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import cli
from hvdtrain.upgrade.exports import MODULES, exports
from hvdtrain.upgrade.rewrite import upgrade_source

ROOT = Path(__file__).resolve().parents[2]


def up(text: str) -> tuple[str, list[str]]:
    """(rewritten text, report lines without the path and the summary)."""
    result = upgrade_source(textwrap.dedent(text))
    return result.text, [line.removeprefix("s.py:") for line in result.report("s.py")[:-1]]


def same(text: str) -> None:
    """``text`` comes back unchanged, with nothing to report."""
    assert up(text) == (textwrap.dedent(text), [])


def run_keras(snippet: str) -> dict:
    """Run a snippet on Keras 3 with a tiny compiled model ``model``, data ``x``, ``y``."""
    scope = {"keras": keras, "tf": tf, "np": np, "K": tf.keras.backend,
             "x": np.ones((4, 2), "float32"), "y": np.ones((4, 1), "float32")}
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    scope["model"] = model
    exec(textwrap.dedent(snippet), scope)
    return scope


def fails_then_runs(before: str, error) -> str:
    """``before`` raises ``error`` on Keras 3 and its rewrite runs; returns the rewrite."""
    with pytest.raises(error):
        run_keras(before)
    after = upgrade_source(textwrap.dedent(before)).text
    assert after != textwrap.dedent(before)
    run_keras(after)
    return after


# --- Horovod's imports --------------------------------------------------------------------

def test_import_horovod_tensorflow_as_hvd():
    text, report = up("import horovod.tensorflow as hvd\nhvd.init()\n"
                      "tape = hvd.DistributedGradientTape(tape)\n")
    assert text == ("import hvdtrain.tensorflow as hvd\nhvd.init()\n"
                    "tape = hvd.DistributedGradientTape(tape)\n")
    assert report == ["1: import horovod.tensorflow as hvd -> import hvdtrain.tensorflow as "
                      "hvd  (hvdtrain.tensorflow has horovod.tensorflow's names on Keras 3)"]


def test_import_horovod_tensorflow_keras_and_its_callbacks():
    text, report = up("""\
        import horovod.tensorflow.keras as hvd
        cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.elastic.KerasState]
        comp = hvd.Compression.fp16
        """)
    assert text.splitlines()[0] == "import hvdtrain.tensorflow.keras as hvd"
    assert text.splitlines()[1:] == [
        "cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.elastic.KerasState]",
        "comp = hvd.Compression.fp16"]
    assert len(report) == 1


def test_from_imports():
    text, report = up("""\
        from horovod.tensorflow import DistributedGradientTape, broadcast_variables as bv
        from horovod.tensorflow.keras.callbacks import (MetricAverageCallback,
                                                        BroadcastGlobalVariablesCallback)
        from horovod import tensorflow as hvd
        from horovod.tensorflow.compression import Compression
        """)
    assert text == textwrap.dedent("""\
        from hvdtrain.tensorflow import DistributedGradientTape, broadcast_variables as bv
        from hvdtrain.tensorflow.keras.callbacks import (MetricAverageCallback,
                                                        BroadcastGlobalVariablesCallback)
        from hvdtrain import tensorflow as hvd
        from hvdtrain.tensorflow import Compression
        """)
    assert [r.split(":")[0] for r in report] == ["1", "2", "4", "5"]
    assert report[3].endswith("(hvdtrain.tensorflow has horovod.tensorflow.compression's "
                              "names on Keras 3)")


def test_bare_import_horovod_and_attribute_chains():
    text, report = up("""\
        import horovod
        horovod.tensorflow.init()
        cb = horovod.tensorflow.keras.callbacks.MetricAverageCallback()
        """)
    assert text == textwrap.dedent("""\
        import hvdtrain.tensorflow.keras
        hvdtrain.tensorflow.init()
        cb = hvdtrain.tensorflow.keras.callbacks.MetricAverageCallback()
        """)
    assert report == [
        "1: import horovod -> import hvdtrain.tensorflow.keras  (the horovod.tensorflow uses "
        "(lines 2, 3) are hvdtrain.tensorflow.keras's now)",
        "2: horovod.tensorflow.init -> hvdtrain.tensorflow.init  (hvdtrain.tensorflow has "
        "horovod.tensorflow's names on Keras 3)",
        "3: horovod.tensorflow.keras.callbacks.MetricAverageCallback -> hvdtrain.tensorflow."
        "keras.callbacks.MetricAverageCallback  (hvdtrain.tensorflow.keras.callbacks has "
        "horovod.tensorflow.keras.callbacks's names on Keras 3)"]


def test_import_horovod_tensorflow_used_by_its_full_name_and_a_second_import_goes():
    text, report = up("import horovod.tensorflow\nimport horovod\nhorovod.tensorflow.init()\n")
    assert text == "import hvdtrain.tensorflow\nhvdtrain.tensorflow.init()\n"
    assert report[1] == ("2: import horovod -> (removed)  (line 1 imports hvdtrain.tensorflow "
                         "already)")


def test_horovod_run_keeps_import_horovod_and_version_is_reported():
    text, report = up("""\
        import horovod
        import horovod.tensorflow.keras as hvd
        print(horovod.__version__)
        horovod.run(train, np=2)
        """)
    assert text.splitlines()[:2] == ["import horovod", "import hvdtrain.tensorflow.keras as hvd"]
    assert report[1] == ("3: NOT REWRITTEN: horovod.__version__: Horovod's own, with no "
                         "hvdtrain equivalent (`import horovod` is kept for it); check it "
                         "still means what the script needs")
    assert len(report) == 2  # horovod.run is Horovod's launcher: it works as it is


def test_horovod_kept_beside_hvdtrain_when_other_uses_need_it():
    text, report = up("import horovod\nhorovod.tensorflow.init()\nhorovod.run(f)\n")
    assert text == "import horovod, hvdtrain.tensorflow\nhvdtrain.tensorflow.init()\n" \
                   "horovod.run(f)\n"
    assert report[0].endswith("; `horovod` stays imported for horovod.run)")


def test_names_hvdtrain_lacks_are_reported_and_their_import_left():
    text, report = up("""\
        from horovod.tensorflow import rank, vars_to_refs
        import horovod.tensorflow as hvd
        refs = hvd.vars_to_refs(model.variables)
        """)
    assert text.splitlines()[0] == "from horovod.tensorflow import rank, vars_to_refs"
    assert "1: NOT REWRITTEN: from horovod.tensorflow import rank, vars_to_refs: " \
           "hvdtrain.tensorflow has no `vars_to_refs`" in report[1]
    assert report[2].startswith("3: NOT REWRITTEN: hvd.vars_to_refs: hvdtrain.tensorflow has "
                                "no `vars_to_refs`")


def test_standalone_horovod_keras_maps_to_hvdtrain_tensorflow_keras():
    text, report = up("import horovod.keras as hvd\nfrom horovod.keras.callbacks import "
                      "MetricAverageCallback\nhvd.PartialDistributedOptimizer(opt)\n")
    assert text.splitlines()[:2] == [
        "import hvdtrain.tensorflow.keras as hvd",
        "from hvdtrain.tensorflow.keras.callbacks import MetricAverageCallback"]
    assert report[2].startswith("3: NOT REWRITTEN: hvd.PartialDistributedOptimizer: "
                                "hvdtrain.tensorflow.keras has no `PartialDistributedOptimizer`")


def test_broadcast_global_variables_is_reported_as_graph_mode_only():
    _, report = up("import horovod.tensorflow as hvd\nhvd.broadcast_global_variables(0)\n")
    assert report[1].startswith("2: NOT REWRITTEN: hvd.broadcast_global_variables: "
                                "broadcast_global_variables works in TensorFlow 1 graph mode")


def test_other_horovod_frameworks_are_left_alone():
    same("import horovod.torch as hvd\nfrom horovod.runner import run\nhvd.init()\n")


def test_the_module_map_names_modules_hvdtrain_has():
    names = exports()
    assert set(MODULES.values()) <= set(names)
    assert {"DistributedOptimizer", "DistributedGradientTape", "elastic", "init"} \
        <= names["hvdtrain.tensorflow"]
    assert {"DistributedOptimizer", "load_model", "callbacks"} \
        <= names["hvdtrain.tensorflow.keras"]
    assert "KerasState" in names["hvdtrain.tensorflow.keras.elastic"]


# --- optimizers ----------------------------------------------------------------------------

def test_optimizer_lr_keyword():
    text, report = up("""\
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(lr=0.001 * hvd.size()))
        opt = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
        parser.add_argument('--lr', type=float)
        sched(lr=0.1)
        """)
    assert text == textwrap.dedent("""\
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(learning_rate=0.001 * hvd.size()))
        opt = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
        parser.add_argument('--lr', type=float)
        sched(lr=0.1)
        """)
    assert report == ["1: lr=0.001 * hvd.size() -> learning_rate=0.001 * hvd.size()  "
                      "(Keras 3 optimizers take learning_rate=, not lr=)"]
    fails_then_runs("keras.optimizers.Adam(lr=0.1)", ValueError)


def test_optimizer_imported_bare_and_decay_reported():
    text, report = up("from tensorflow.keras.optimizers import SGD\nopt = SGD(lr=0.1, "
                      "decay=1e-4)\n")
    assert text == "from tensorflow.keras.optimizers import SGD\nopt = SGD(learning_rate=0.1, " \
                   "decay=1e-4)\n"
    assert report[1].startswith("2: NOT REWRITTEN: decay=1e-4: Keras 3 optimizers ignore "
                                "decay= (a warning only)")


def test_optimizer_lr_attribute():
    text, report = up("""\
        print(opt.lr, args.lr, model.optimizer.lr)
        self.model.optimizer.lr = 0.5
        o = keras.optimizers.Adam(0.1)
        o.lr
        """)
    assert text == textwrap.dedent("""\
        print(opt.learning_rate, args.lr, model.optimizer.learning_rate)
        self.model.optimizer.learning_rate = 0.5
        o = keras.optimizers.Adam(0.1)
        o.learning_rate
        """)
    assert report[0] == ("1: opt.lr -> opt.learning_rate  (Keras 3 optimizers have no `lr`, "
                         "only `learning_rate`)")
    assert len(report) == 4
    fails_then_runs("model.optimizer.lr", AttributeError)


def test_backend_set_value_and_get_value():
    text, report = up("""\
        from tensorflow.keras import backend as K
        K.set_value(model.optimizer.lr, 0.05)
        tf.keras.backend.set_value(model.optimizer.learning_rate,  0.5 * K.get_value(v))
        """)
    assert text == textwrap.dedent("""\
        from tensorflow.keras import backend as K
        model.optimizer.learning_rate.assign(0.05)
        model.optimizer.learning_rate.assign(0.5 * v.numpy())
        """)
    assert report[0].startswith("2: K.set_value(model.optimizer.lr, 0.05) -> "
                                "model.optimizer.learning_rate.assign(0.05)  (Keras 3 has no")
    assert report[1].startswith("2: model.optimizer.lr -> model.optimizer.learning_rate")
    assert report[3].startswith("3: K.get_value(v) -> v.numpy()  (Keras 3 has no keras."
                                "backend.get_value")
    fails_then_runs("from tensorflow.keras import backend as K\n"
                    "K.set_value(model.optimizer.learning_rate, 0.05)\n"
                    "assert abs(float(model.optimizer.learning_rate) - 0.05) < 1e-7",
                    AttributeError)


def test_optimizer_variables_call():
    text, report = up("""\
        hvd.broadcast_variables(opt.variables(), root_rank=0)
        w = model.variables()
        """)
    assert text == textwrap.dedent("""\
        hvd.broadcast_variables(opt.variables, root_rank=0)
        w = model.variables()
        """)
    assert report == [
        "1: opt.variables() -> opt.variables  (Keras 3 optimizers' `variables` is a property "
        "(a list))",
        "2: NOT REWRITTEN: model.variables(): on Keras 3 optimizers, layers and models "
        "`variables` is a property (a list): drop the () if this is one"]
    fails_then_runs("opt = model.optimizer\nv = opt.variables()\nassert isinstance(v, list)",
                    TypeError)


def test_legacy_optimizers():
    text, report = up("""\
        from tensorflow.keras.optimizers.legacy import SGD
        opt = tf.keras.optimizers.legacy.Adam(0.1)
        """)
    assert text == textwrap.dedent("""\
        from tensorflow.keras.optimizers import SGD
        opt = tf.keras.optimizers.Adam(0.1)
        """)
    assert [r.split(":")[0] for r in report] == ["1", "2"]
    fails_then_runs("tf.keras.optimizers.legacy.Adam(0.1)", ImportError)


# --- metrics -------------------------------------------------------------------------------

def test_metric_reset_states_and_rnn_layers_reported():
    text, report = up("""\
        train_loss = tf.keras.metrics.Mean(name='train_loss')
        train_loss.reset_states()
        for m in model.metrics:
            m.reset_states()
        lstm.reset_states()
        """)
    assert text == textwrap.dedent("""\
        train_loss = tf.keras.metrics.Mean(name='train_loss')
        train_loss.reset_state()
        for m in model.metrics:
            m.reset_state()
        lstm.reset_states()
        """)
    assert report[0] == ("2: train_loss.reset_states -> train_loss.reset_state  (Keras 3 "
                         "metrics have reset_state(), not reset_states())")
    assert report[2] == ("5: NOT REWRITTEN: lstm.reset_states(): if this is a Keras metric, "
                         "call reset_state() (Keras 3 metrics have no reset_states); a "
                         "stateful RNN layer keeps reset_states()")
    fails_then_runs("keras.metrics.Mean().reset_states()", AttributeError)


# --- compile and fit -----------------------------------------------------------------------

def test_compile_experimental_run_tf_function_dropped():
    text, report = up("""\
        model.compile(loss=loss,
                      optimizer=opt,  # Horovod's
                      metrics=['accuracy'],
                      experimental_run_tf_function=False)
        model.compile(loss=loss, experimental_run_tf_function=False, optimizer=opt)
        model.compile(optimizer=opt,  # scaled
                      experimental_run_tf_function=False)
        """)
    assert text == textwrap.dedent("""\
        model.compile(loss=loss,
                      optimizer=opt,  # Horovod's
                      metrics=['accuracy'])
        model.compile(loss=loss, optimizer=opt)
        model.compile(optimizer=opt,  # scaled
                      )
        """)
    assert report[0] == ("4: experimental_run_tf_function=False -> (removed)  (Keras 3's "
                         "compile() rejects it; its fit calls the optimizer, distributed or "
                         "not, without it)")
    fails_then_runs("model.compile(optimizer='sgd', loss='mse', experimental_run_tf_function="
                    "False)", TypeError)


def test_fit_loader_arguments_dropped():
    text, report = up("""\
        model.fit(x, y,
                  epochs=2,  # two
                  max_queue_size=10,
                  workers=4,  # four
                  use_multiprocessing=True,
        )
        model.fit(x, y, workers=4, epochs=3)
        model.predict(x, workers=2)
        """)
    assert text == textwrap.dedent("""\
        model.fit(x, y,
                  epochs=2,  # two
        )
        model.fit(x, y, epochs=3)
        model.predict(x)
        """)
    assert report[0] == ("3: max_queue_size=10, workers=4, use_multiprocessing=True -> "
                         "(removed)  (Keras 3's fit/evaluate/predict reject it; a keras.utils."
                         "PyDataset takes workers/use_multiprocessing/max_queue_size in its "
                         "super().__init__())")
    fails_then_runs("model.fit(x, y, verbose=0, workers=2)", TypeError)


@pytest.mark.parametrize("before,after", [
    ("m.fit(x, workers=4)\n", "m.fit(x)\n"),
    ("m.fit(workers=4)\n", "m.fit()\n"),
    ("m.fit(x, (y), workers=(4))\n", "m.fit(x, (y))\n"),
    ("m.fit(x, *a, workers=4, **kw)\n", "m.fit(x, *a, **kw)\n"),
    ("m.fit(x, workers=4,  # w\n      epochs=2)\n", "m.fit(x,  # w\n      epochs=2)\n"),
    ("m.fit(x, workers=4,\n      epochs=2)\n", "m.fit(x,\n      epochs=2)\n"),
    ("m.fit(\n    x,\n    workers=4\n)\n", "m.fit(\n    x\n)\n"),
    ("m.fit(\n    workers=4,  # w\n    x=x,\n)\n", "m.fit(\n    x=x,\n)\n"),
    ("m.evaluate_generator((g), (10), None, (8), 4)\n",
     "m.evaluate((g), steps=(10), callbacks=None, verbose=0)\n"),
    ("m.predict_generator(generator=g, steps=3)\n", "m.predict(x=g, steps=3, verbose=0)\n"),
], ids=range(10))
def test_argument_lists_keep_their_commas_parentheses_and_comments(before, after):
    assert up(before)[0] == after


@pytest.mark.filterwarnings("ignore:`shuffle=True` was passed")
def test_generator_methods_renamed_and_positionals_named():
    text, report = up("""\
        model.fit_generator(train_iter,
                            steps_per_epoch=10,
                            workers=4,
                            epochs=2)
        score = model.evaluate_generator(test_iter, len(test_iter), workers=4)
        p = model.predict_generator(gen, 3, verbose=1)
        """)
    assert text == textwrap.dedent("""\
        model.fit(train_iter,
                  steps_per_epoch=10,
                  epochs=2)
        score = model.evaluate(test_iter, steps=len(test_iter), verbose=0)
        p = model.predict(gen, steps=3, verbose=1)
        """)
    assert report[:2] == [
        "1: model.fit_generator -> model.fit  (Keras 3 has no fit_generator: fit() takes "
        "generators and PyDatasets)",
        "3: workers=4 -> (removed)  (Keras 3's fit() rejects it; a keras.utils.PyDataset "
        "takes it in its super().__init__())"]
    assert report[4] == ("5: workers=4 -> (removed)  (Keras 3's evaluate() rejects it; a "
                         "keras.utils.PyDataset takes it in its super().__init__())")
    assert report[5] == ("5: (added) -> verbose=0  (evaluate_generator was silent by default, "
                         "evaluate() prints a progress bar)")
    gen = "def gen():\n    while True:\n        yield x, y\n"
    after = fails_then_runs(gen + "model.fit_generator(gen(), 2, verbose=0)\n"
                                  "model.evaluate_generator(gen(), 2)", AttributeError)
    assert after.endswith("model.fit(gen(), steps_per_epoch=2, verbose=0)\n"
                          "model.evaluate(gen(), steps=2, verbose=0)")


# --- checkpoint and save paths -------------------------------------------------------------

def test_model_checkpoint_period_one_and_h5_path():
    text, report = up("""\
        cb = keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5', period=1)
        model = hvd.load_model('./checkpoint-{epoch}.h5'.format(epoch=3))
        """)
    assert text == textwrap.dedent("""\
        cb = keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.keras', save_freq='epoch')
        model = hvd.load_model('./checkpoint-{epoch}.keras'.format(epoch=3))
        """)
    assert report == [
        "1: './checkpoint-{epoch}.h5' -> './checkpoint-{epoch}.keras'  (Keras 3's own format is "
        ".keras: its .h5 is legacy HDF5, which load_model cannot always read back (hvd."
        "load_model takes .keras))",
        "1: period=1 -> save_freq='epoch'  (Keras 3's ModelCheckpoint has no period; "
        "save_freq=\"epoch\" saves every epoch)",
        "2: './checkpoint-{epoch}.h5' -> './checkpoint-{epoch}.keras'  (the same path as line 1, "
        "rewritten there)"]


def test_model_checkpoint_period_n_is_rewritten_with_a_check(tmp_path):
    text, report = up('cb = ModelCheckpoint(filepath=f"{d}/w-{{epoch}}.h5", '
                      'save_weights_only=True, period=5)\n')
    assert text == 'cb = ModelCheckpoint(filepath=f"{d}/w-{{epoch}}.weights.h5", ' \
                   'save_weights_only=True, save_freq="epoch")\n'
    assert report[0].startswith('1: f"{d}/w-{{epoch}}.h5" -> f"{d}/w-{{epoch}}.weights.h5"  '
                                "(Keras 3's ModelCheckpoint with save_weights_only writes only "
                                ".weights.h5 files)")
    assert report[1] == (
        '1: period=5 -> save_freq="epoch"  (Keras 3\'s ModelCheckpoint has no period; '
        'save_freq="epoch" saves every epoch; CHECK: it was every 5 epochs and Keras 3 has no '
        "every-N-epochs option: save_freq=5 * steps_per_epoch (an int counts batches, and a "
        "val_ monitor is then not available) or a callback that saves in on_epoch_end)")
    d = str(tmp_path)
    fails_then_runs(f"cb = keras.callbacks.ModelCheckpoint('{d}/w.h5', save_weights_only=True,"
                    " period=5)\nmodel.fit(x, y, verbose=0, callbacks=[cb])", TypeError)
    assert (tmp_path / "w.weights.h5").exists()
    with pytest.raises(ValueError, match="weights.h5"):
        run_keras(f"keras.callbacks.ModelCheckpoint('{d}/w.h5', save_weights_only=True)")


def test_tensorflow_checkpoint_weights_paths_become_weights_h5(tmp_path):
    # Keras 2 wrote save_weights_only / save_weights to a .ckpt path as a TensorFlow
    # checkpoint (TensorFlow's tutorials, Databricks' HorovodRunner notebook); Keras 3 refuses
    text, report = up("""\
        cb = ModelCheckpoint(checkpoint_dir + '/checkpoint-{epoch}.ckpt', save_weights_only = True)
        model.save_weights("w.tf")
        model.load_weights("w.tf")
        full = ModelCheckpoint("model.ckpt")
        """)
    assert text == textwrap.dedent("""\
        cb = ModelCheckpoint(checkpoint_dir + '/checkpoint-{epoch}.weights.h5', save_weights_only = True)
        model.save_weights("w.weights.h5")
        model.load_weights("w.weights.h5")
        full = ModelCheckpoint("model.ckpt")
        """)
    assert report[0] == ("1: '/checkpoint-{epoch}.ckpt' -> '/checkpoint-{epoch}.weights.h5'  "
                         "(Keras 3's ModelCheckpoint with save_weights_only writes only "
                         ".weights.h5 files; Keras 2 wrote a TensorFlow checkpoint for .ckpt)")
    assert report[2].startswith('3: "w.tf" -> "w.weights.h5"  (the same path as line 2')
    assert report[3].startswith('4: NOT REWRITTEN: "model.ckpt"')  # a full model: not weights
    _, report = up("""\
        cb = ModelCheckpoint("training/cp-{epoch:04d}.ckpt", save_weights_only=True)
        model.load_weights(tf.train.latest_checkpoint("training"))
        """)
    assert report[0].endswith("; CHECK: it was a TensorFlow checkpoint (.index and .data "
                              "files) and Keras 3 writes one HDF5 file at this path: "
                              "tf.train.latest_checkpoint does not find it; load it with "
                              "model.load_weights(path))")
    d = str(tmp_path)
    fails_then_runs(f"cb = keras.callbacks.ModelCheckpoint('{d}/cp-{{epoch}}.ckpt', "
                    "save_weights_only=True)\nmodel.fit(x, y, verbose=0, callbacks=[cb])",
                    ValueError)
    assert (tmp_path / "cp-1.weights.h5").exists()


def test_checkpoint_path_from_argparse_and_unknown_paths():
    text, report = up("""\
        parser.add_argument('--checkpoint-format', default='./checkpoint-{epoch}.h5')
        cb = keras.callbacks.ModelCheckpoint(args.checkpoint_format)
        cb2 = keras.callbacks.ModelCheckpoint(make_path())
        """)
    assert text.splitlines()[0] == \
        "parser.add_argument('--checkpoint-format', default='./checkpoint-{epoch}.keras')"
    assert report[0].endswith("; the path of line 2)")
    assert report[1] == ("3: NOT REWRITTEN: make_path(): Keras 3's ModelCheckpoint writes "
                         ".keras (or legacy .h5) files: make sure this path ends in .keras")


def test_save_weights_and_save_format(tmp_path):
    text, report = up("""\
        model.save_weights("w.h5")
        model.load_weights("w.h5")
        model.save("final.h5", save_format="h5")
        model.save("exported", save_format="tf")
        np.save("a.npy", arr)
        """)
    assert text == textwrap.dedent("""\
        model.save_weights("w.weights.h5")
        model.load_weights("w.weights.h5")
        model.save("final.h5")
        model.save("exported", save_format="tf")
        np.save("a.npy", arr)
        """)
    assert report[2] == ('3: save_format="h5" -> (removed)  (Keras 3 infers the format from '
                         "the path's extension and refuses save_format)")
    assert report[3].startswith('4: NOT REWRITTEN: save_format="tf": Keras 3 saves only '
                                ".keras (or legacy .h5) files: for a TensorFlow SavedModel "
                                "call model.export(path)")
    fails_then_runs(f"model.save_weights('{tmp_path}/w.h5')\nmodel.load_weights('{tmp_path}"
                    "/w.h5')", ValueError)


def test_save_without_extension_is_reported():
    _, report = up('model.save("saved_model_dir")\n')
    assert report[0].startswith('1: NOT REWRITTEN: "saved_model_dir": Keras 3 saves only')


# --- sessions and TF 1 ---------------------------------------------------------------------

def test_sessions_are_reported_with_the_gpu_pinning_fix():
    text, report = up("""\
        from keras import backend as K
        config = tf.ConfigProto()
        K.set_session(tf.Session(config=config))
        """)
    assert up(text)[0] == text
    assert [r.split(": NOT REWRITTEN: ")[0] for r in report] == ["2", "3"]
    assert report[1].startswith("3: NOT REWRITTEN: K.set_session(tf.Session(config=config)): "
                                "Keras 3 has no sessions: pin the GPU with gpus = tf.config."
                                "list_physical_devices('GPU')")


# --- the text around the changes -----------------------------------------------------------

def test_everything_else_stays_byte_for_byte():
    source = ("# -*- coding: utf-8 -*-\r\n\"\"\"Entraînement — ünïcode.\"\"\"\r\n"
              "import horovod.tensorflow as hvd  # the drop-in\r\n"
              "x = 'é' ; opt = keras.optimizers.Adam(lr=1e-3)  # ∆\r\n"
              "\f\r\nif x:\r\n\tprint(x)   # tab\r\n")
    result = upgrade_source(source)
    assert result.text == source.replace("horovod.tensorflow", "hvdtrain.tensorflow") \
        .replace("lr=1e-3", "learning_rate=1e-3")
    same("import os\n\n\n# nothing Horovod here\nprint(os.sep)  # done\n")


def test_a_syntax_error_names_the_line():
    with pytest.raises(SyntaxError) as err:
        upgrade_source("import horovod.tensorflow as hvd\nx = (\n", "train.py")
    assert (err.value.filename, err.value.lineno) == ("train.py", 2)


# --- the command ---------------------------------------------------------------------------

def test_command_writes_stdout_or_a_file_and_reports(tmp_path, capsysbinary):
    script = tmp_path / "train.py"
    script.write_bytes("# é\nimport horovod.tensorflow as hvd\n".encode("latin-1").replace(
        b"# ", b"# -*- coding: latin-1 -*-\n# "))
    assert cli.main(["upgrade", str(script)]) == 0
    out, err = capsysbinary.readouterr()
    assert out == script.read_bytes().replace(b"horovod", b"hvdtrain")
    assert err.decode().splitlines() == [
        f"{script}:3: import horovod.tensorflow as hvd -> import hvdtrain.tensorflow as hvd  "
        "(hvdtrain.tensorflow has horovod.tensorflow's names on Keras 3)",
        f"{script}: 1 change, 0 to fix or check by hand"]
    out_file = tmp_path / "out" / "new.py"
    out_file.parent.mkdir()
    assert cli.main(["upgrade", str(script), "-o", str(out_file)]) == 0
    assert out_file.read_bytes() == out
    assert capsysbinary.readouterr().out.decode().splitlines()[-1] == f"wrote {out_file}"


def test_command_to_a_text_only_stdout(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import horovod.tensorflow as hvd  # é\n", encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["upgrade", str(script)]) == 0
    assert out.getvalue() == "import hvdtrain.tensorflow as hvd  # é\n"
    assert err.getvalue().endswith(": 1 change, 0 to fix or check by hand\n")


def test_command_in_place_keeps_a_backup(tmp_path, capsys):
    script = tmp_path / "train.py"
    original = "import horovod.tensorflow.keras as hvd\n"
    script.write_text(original)
    script.chmod(0o750)
    assert cli.main(["upgrade", "--in-place", str(script)]) == 0
    assert script.read_text() == "import hvdtrain.tensorflow.keras as hvd\n"
    assert (tmp_path / "train.py.orig").read_text() == original
    assert script.stat().st_mode & 0o777 == 0o750
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"kept the original as {script}.orig", f"rewrote {script}"]
    assert cli.main(["upgrade", "--in-place", "--no-backup", str(script)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{script} left as it is (nothing to " \
                                                       "rewrite)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", "train.py.orig"]


def test_command_errors_name_the_file(tmp_path, capsys):
    assert cli.main(["upgrade", str(tmp_path / "missing.py")]) == 1
    assert capsys.readouterr().err == \
        f"hvdtrain upgrade: error: {tmp_path / 'missing.py'}: no such file\n"
    bad = tmp_path / "bad.py"
    bad.write_text("import horovod.tensorflow as hvd\nx = (\n")
    assert cli.main(["upgrade", "--in-place", str(bad)]) == 1
    assert capsys.readouterr().err.startswith(f"hvdtrain upgrade: error: {bad}:2:")
    assert bad.read_text() == "import horovod.tensorflow as hvd\nx = (\n"
    assert not (tmp_path / "bad.py.orig").exists()
    assert cli.main(["upgrade", str(bad), "-o", str(bad)]) == 1
    assert "use --in-place" in capsys.readouterr().err
    assert cli.main(["upgrade", str(bad), "--no-backup"]) == 2
    assert "--no-backup goes with --in-place" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["upgrade", str(bad), "-o", "x.py", "--in-place"])


@pytest.mark.timeout(60)
def test_the_command_runs_without_tensorflow(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import horovod.tensorflow.keras as hvd\nopt = keras.optimizers.SGD("
                      "lr=0.1)\n")
    code = ("import runpy, sys; sys.argv = ['hvdtrain', 'upgrade', sys.argv[1]]\n"
            "try:\n    runpy.run_module('hvdtrain.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "import hvdtrain.tensorflow.keras as hvd\nopt = keras.optimizers." \
                          "SGD(learning_rate=0.1)\n[]\n"
    assert proc.stderr.splitlines()[-1].endswith(": 2 changes, 0 to fix or check by hand")


@pytest.mark.timeout(180)
def test_an_upgraded_horovod_fit_script_trains_and_resumes(tmp_path):
    """A Horovod ``model.fit`` script with the usual Keras 2 idioms, upgraded, runs on one
    rank with hvdtrain and Keras 3: it trains, checkpoints and loads its checkpoint."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd

        hvd.init()
        x = np.random.RandomState(0).rand(64, 4).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(lr=0.01 * hvd.size()))
        model.compile(loss="mse", optimizer=opt,
                      experimental_run_tf_function=False)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback()]
        if hvd.rank() == 0:
            callbacks.append(tf.keras.callbacks.ModelCheckpoint("ck-{epoch}.h5", period=1))
        model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0, workers=2)
        tf.keras.backend.set_value(model.optimizer.lr, 0.5)
        restored = hvd.load_model("ck-{epoch}.h5".format(epoch=2))
        print(float(model.optimizer.lr), type(restored.optimizer).__name__)
        """))
    assert cli.main(["upgrade", "--in-place", "--no-backup", str(script)]) == 0
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "0.5 Adam"
    assert (tmp_path / "ck-2.keras").exists()


def test_the_readme_example_is_what_the_command_does():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### `hvdtrain upgrade`"):]
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```$", section, re.S | re.M)
    before, after, shown = blocks[1:4]
    before, after = (re.sub(r" +# (before|after)$", "", b, flags=re.M) for b in (before, after))
    result = upgrade_source(before)
    assert result.text == after
    real = result.report("train.py")
    shown = shown.splitlines()
    assert len(shown) == len(real)
    for short, line in zip(shown, real):  # the README shortens with "..."
        assert all(part in line for part in short.split("...")), (short, line)
